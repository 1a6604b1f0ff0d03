"""Frozen configuration: the model's shape (``ModelConfig``) and the engine's limits (``EngineConfig``).

Owns the numbers every other module reads; it does not read files (``loader`` builds a
``ModelConfig`` from a Hugging Face ``config.json`` or GGUF metadata) nor environment variables.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

DType = Literal["float32", "bfloat16", "float16"]
Quantization = Literal["none", "int8", "int4", "gguf"]
QUANTIZATIONS: tuple[Quantization, ...] = ("none", "int8", "int4", "gguf")


@dataclass(frozen=True, slots=True)
class RopeScaling:
    """Llama 3.1 style RoPE frequency scaling (``rope_type: llama3``)."""

    factor: float
    """Divides the low frequencies."""
    low_freq_factor: float
    """Wavelengths above ``original_max_position / low_freq_factor`` are fully scaled."""
    high_freq_factor: float
    """Wavelengths below ``original_max_position / high_freq_factor`` are left alone."""
    original_max_position: int
    """Context length the model was pre-trained with."""


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """Shape of a Llama-family decoder (Llama 2/3, SmolLM2, Mistral, Qwen2)."""

    vocab_size: int
    """Rows of the embedding and of the LM head."""
    hidden_size: int
    """Residual stream width C."""
    intermediate_size: int
    """Width of the SiLU-gated MLP."""
    num_layers: int
    """Decoder blocks."""
    num_heads: int
    """Query heads."""
    num_kv_heads: int
    """Key/value heads (grouped-query attention when fewer than ``num_heads``)."""
    head_dim: int
    """Per-head width; usually ``hidden_size // num_heads`` but Mistral Nemo and others differ."""
    rope_theta: float = 10000.0
    """RoPE base."""
    rope_scaling: RopeScaling | None = None
    """Llama 3.1 frequency scaling, or None."""
    rms_norm_eps: float = 1e-6
    """Epsilon of every RMSNorm."""
    tie_word_embeddings: bool = False
    """LM head shares the embedding matrix."""
    qkv_bias: bool = False
    """Q, K and V projections carry a bias (Qwen2, Llama with ``attention_bias``)."""
    o_bias: bool = False
    """The output projection carries a bias (Llama with ``attention_bias``)."""
    mlp_bias: bool = False
    """Gate, up and down projections carry a bias."""
    max_position_embeddings: int = 4096
    """Longest context the model supports."""
    bos_token_id: int | None = None
    """Beginning-of-sequence token, if any."""
    eos_token_ids: tuple[int, ...] = ()
    """Tokens that end generation unless a request sets ``ignore_eos``."""
    architecture: str = "llama"
    """Family name, for logs and ``/v1/models``."""

    def num_params(self) -> int:
        """Count the parameters (the tied LM head counted once)."""
        c, h = self.hidden_size, self.head_dim
        attn = c * h * (self.num_heads * 2 + self.num_kv_heads * 2)
        mlp = 3 * c * self.intermediate_size
        per_layer = attn + mlp + 2 * c
        head = 0 if self.tie_word_embeddings else self.vocab_size * c
        return self.vocab_size * c + self.num_layers * per_layer + c + head


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Limits and switches of one engine instance."""

    block_size: int = 16
    """Tokens per KV block."""
    num_kv_blocks: int | None = None
    """KV blocks in the pool; None sizes the pool from ``kv_cache_memory_bytes``."""
    kv_cache_memory_bytes: int = 256 * 1024 * 1024
    """Memory given to the KV pool when ``num_kv_blocks`` is None."""
    max_num_seqs: int = 32
    """Most requests running in one step."""
    max_num_batched_tokens: int = 512
    """Per-step token budget shared by prefill chunks and decodes."""
    max_model_len: int | None = None
    """Longest prompt plus output; None takes ``min(model max, 8192)``."""
    long_prefill_token_threshold: int = 0
    """Largest prefill chunk of one request per step (0: only the step budget limits it)."""
    mixed_prefill_tokens: int = 128
    """Most tokens that prompt chunks (requests running more than one token) take in a step that also
    runs decodes; 0: only the step budget limits them. A chunk's tokens cost the step far more than a
    decode's, so this keeps the running requests' inter-token latency near their steady step while
    long prompts arrive, yet a step with nothing decoding (a prompt alone) still fills the budget.
    Throughput-bound offline runs set it to 0."""
    dtype: DType = "float32"
    """Weights, activations and KV cache dtype."""
    device: str = "cpu"
    """Torch device."""
    quantization: Quantization = "none"
    """Weight-only quantization of the linear layers and LM head (CPU kernels, or the Triton kernels on
    CUDA): ``int8`` per output channel, ``int4`` per group of ``quant_group_size`` columns; ``none``
    keeps float weights. ``gguf`` loads a GGUF file's Q4_1 and Q8_0 tensors as they are onto the
    kernels (``models.gguf_native``, no dequantize-requantize; needs the kernels)."""
    quant_group_size: int = 32
    """Input columns sharing one int4 scale and zero (32, 64, 128 or 256)."""
    use_kernels: bool | None = None
    """Run the model on the Triton kernels (``models.fused``); None: on CUDA devices only. True on the
    CPU needs ``TRITON_INTERPRET=1`` (tests); without it the kernels fall back to their references."""
    enforce_eager: bool = False
    """Never replay CUDA graphs (decode steps then launch every kernel from Python)."""
    cuda_graph_batch_sizes: tuple[int, ...] = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256)
    """Row counts of the decode graphs (a row per new token of a step whose requests run one token
    each, or of a step of a few tokens in all; ``selfhost.graphs``), a step padded to the next one;
    capped at ``max_num_seqs``, whose own size is always captured."""
    cuda_graph_token_sizes: tuple[int, ...] = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
    """Token counts of the steps the decode graphs do not take (prefills, chunks mixed with decodes;
    ``runner.DECODE_ROWS_MAX``) captured in CUDA graphs (``selfhost.step_graphs``; a step is padded
    to the next one); capped at ``max_num_batched_tokens``, whose own size is always captured;
    empty: none."""
    async_scheduling: bool | None = None
    """Plan and launch step n+1 before step n's sampled tokens reach the host, so host work (scheduling,
    text, metrics) overlaps the device's; outputs then arrive one ``step`` call later. None: on CUDA
    devices only (on the CPU the host is the device, so there is nothing to overlap)."""
    enable_prefix_caching: bool = True
    """Reuse KV blocks across requests by chained block hash."""
    salt_by_tenant: bool = True
    """Mix each request's tenant into its block hashes, so tenants never share KV blocks."""
    num_threads: int | None = None
    """Torch intra-op threads on the CPU; None leaves torch's default."""
    peak_flops: float = 2.0e11
    """Device peak FLOP/s, for the MFU estimate (default: a rough 2-core AVX2 CPU)."""
    peak_memory_bandwidth: float = 2.0e10
    """Device peak bytes/s, for the MBU estimate (default: a rough 2-core CPU)."""
    served_model_name: str = field(default="")
    """Name shown by ``/v1/models``; empty takes the model's file or folder name."""

    def __post_init__(self) -> None:
        if self.block_size <= 0:
            raise ValueError(f"block_size must be positive, got {self.block_size}")
        if self.max_num_seqs <= 0:
            raise ValueError(f"max_num_seqs must be positive, got {self.max_num_seqs}")
        if self.max_num_batched_tokens <= 0:
            raise ValueError(f"max_num_batched_tokens must be positive, got {self.max_num_batched_tokens}")
        if self.mixed_prefill_tokens < 0:
            raise ValueError(f"mixed_prefill_tokens must be 0 or positive, got {self.mixed_prefill_tokens}")
        if self.quantization not in QUANTIZATIONS:
            raise ValueError(f"quantization must be one of {QUANTIZATIONS}, got {self.quantization!r}")
        if self.quant_group_size not in (32, 64, 128, 256):
            raise ValueError(f"quant_group_size must be 32, 64, 128 or 256, got {self.quant_group_size}")
        if self.quantization == "gguf" and not self.kernels_enabled:
            raise ValueError("quantization 'gguf' runs on the Triton kernels: a CUDA device or use_kernels=True")
        if self.quantization != "none" and self.device != "cpu" and not self.device.startswith("cuda"):
            raise ValueError(f"quantization {self.quantization!r} runs on the CPU or CUDA, not on {self.device!r}")
        if any(b <= 0 for b in self.cuda_graph_batch_sizes):
            raise ValueError(f"cuda_graph_batch_sizes must be positive, got {self.cuda_graph_batch_sizes}")
        if any(t <= 0 for t in self.cuda_graph_token_sizes):
            raise ValueError(f"cuda_graph_token_sizes must be positive, got {self.cuda_graph_token_sizes}")
        if self.num_kv_blocks is not None and self.num_kv_blocks <= 0:
            raise ValueError(f"num_kv_blocks must be positive, got {self.num_kv_blocks}")

    @property
    def kernels_enabled(self) -> bool:
        """Whether the model runs on the Triton kernels (``use_kernels``, or by default on CUDA)."""
        return self.device.startswith("cuda") if self.use_kernels is None else self.use_kernels

    @property
    def async_enabled(self) -> bool:
        """Whether steps are planned one ahead (``async_scheduling``, or by default on CUDA)."""
        return self.device.startswith("cuda") if self.async_scheduling is None else self.async_scheduling

    def graph_batch_sizes(self) -> tuple[int, ...]:
        """The decode batch sizes to capture (none unless the kernels run on CUDA and graphs are on)."""
        if self.enforce_eager or not self.kernels_enabled or not self.device.startswith("cuda"):
            return ()
        return tuple(sorted({b for b in self.cuda_graph_batch_sizes if b < self.max_num_seqs} | {self.max_num_seqs}))

    def graph_token_sizes(self) -> tuple[int, ...]:
        """The step token counts to capture for the steps the decode graphs do not take (none unless those are on)."""
        if not self.cuda_graph_token_sizes or not self.graph_batch_sizes():
            return ()  # an empty tuple turns these graphs off and leaves the decode graphs on
        budget = self.max_num_batched_tokens
        return tuple(sorted({t for t in self.cuda_graph_token_sizes if t < budget} | {budget}))
