"""Text <-> token ids and chat templates, from the model's own files.

Owns building a ``tokenizers.Tokenizer`` from ``tokenizer.json`` or from GGUF metadata (byte-level
BPE: tokens, merges, pre-tokenizer kind), the special tokens, and rendering the model's Jinja chat
template, and the incremental decoder of one sequence's text (``TextStream``). Does not own text
deltas per step or stop strings (``output``).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

from selfhost.loader import gguf_field, gguf_reader, is_gguf

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from pathlib import Path

ChatMessage = dict[str, Any]

# GGUF ``tokenizer.ggml.pre`` -> split regex applied before byte-level BPE (llama.cpp's table).
_LLAMA3_SPLIT = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_SPLIT_BY_PRE = {"llama-bpe": _LLAMA3_SPLIT, "llama3": _LLAMA3_SPLIT, "qwen2": _QWEN2_SPLIT}
_DIGIT_SPLIT_PRES = {"smollm", "starcoder", "refact"}
_CONTROL, _USER_DEFINED = 3, 4


class TextStream:
    """The text of one growing sequence, token by token (``tokenizers``' ``DecodeStream`` over a tokenizer).

    It decodes a short window before and after each new token and returns the difference, holding
    text back while the bytes end in an unfinished UTF-8 character, as vLLM's and TGI's
    detokenizers do, in one call into the library per token.
    """

    __slots__ = ("_backend", "_stream")

    def __init__(self, backend: HFTokenizer, context: Sequence[int]) -> None:
        """Args: ``context`` ids already there (a prompt's tail): their text is not returned, but the next token's decodes after them."""
        self._backend = backend
        self._stream = decoders.DecodeStream(skip_special_tokens=True, ids=list(context))

    def step(self, token_id: int) -> str:
        """Append ``token_id``; return the text it completes ("" while a character is unfinished)."""
        return self._stream.step(self._backend, token_id) or ""


class Tokenizer:
    """A model's tokenizer: encode, decode, special ids and its chat template.

    Thread-safe for reads (the underlying ``tokenizers`` object is); never mutated after construction.
    """

    def __init__(
        self,
        backend: HFTokenizer,
        *,
        bos_token_id: int | None,
        eos_token_ids: Sequence[int],
        add_bos: bool,
        chat_template: str | None,
    ) -> None:
        self.backend = backend
        self.bos_token_id = bos_token_id
        self.eos_token_ids = tuple(eos_token_ids)
        self.add_bos = add_bos
        self.chat_template = chat_template
        self.vocab_size = backend.get_vocab_size(with_added_tokens=True)
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = _raise_template_error
        env.globals["strftime_now"] = lambda fmt: datetime.now(UTC).strftime(fmt)
        self._template = env.from_string(chat_template) if chat_template else None

    def token(self, token_id: int) -> str | None:
        """The vocabulary string of one id (None when unknown)."""
        return self.backend.id_to_token(token_id)

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``; with ``add_special_tokens`` the BOS is prepended when the model wants one."""
        ids: list[int] = self.backend.encode(text, add_special_tokens=False).ids
        bos = self.bos_token_id
        if add_special_tokens and self.add_bos and bos is not None and (not ids or ids[0] != bos):
            ids.insert(0, bos)
        return ids

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        """Text of ``ids``."""
        return str(self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens))

    def text_stream(self, context: Sequence[int] = ()) -> TextStream:
        """An incremental decoder whose text starts after ``context``."""
        return TextStream(self.backend, context)

    def apply_chat_template(self, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = True) -> str:
        """Render ``messages`` with the model's chat template.

        Raises:
            ValueError: the model has no chat template, or the template rejects the messages.
        """
        if self._template is None:
            raise ValueError("this model has no chat template; use /v1/completions with a plain prompt")
        bos = self.token(self.bos_token_id) if self.bos_token_id is not None else ""
        eos = self.token(self.eos_token_ids[0]) if self.eos_token_ids else ""
        return self._template.render(
            messages=[dict(m) for m in messages],
            add_generation_prompt=add_generation_prompt,
            bos_token=bos,
            eos_token=eos,
        )

    def encode_chat(self, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = True) -> list[int]:
        """Token ids of the rendered chat (the template writes its own special tokens)."""
        return self.encode(
            self.apply_chat_template(messages, add_generation_prompt=add_generation_prompt), add_special_tokens=False
        )


def _raise_template_error(message: str) -> None:
    raise ValueError(f"chat template error: {message}")


def load_tokenizer(path: Path, eos_token_ids: Sequence[int] = (), bos_token_id: int | None = None) -> Tokenizer:
    """Build the tokenizer of the model at ``path`` (a GGUF file or a HF folder with ``tokenizer.json``).

    Raises:
        ValueError: no usable tokenizer is found.
    """
    if is_gguf(path):
        return _from_gguf(path)
    file = path / "tokenizer.json"
    if not file.is_file():
        raise ValueError(f"no tokenizer.json in {path}")
    backend = HFTokenizer.from_file(str(file))
    cfg_file = path / "tokenizer_config.json"
    cfg: dict[str, Any] = json.loads(cfg_file.read_text()) if cfg_file.is_file() else {}
    template = cfg.get("chat_template")
    if isinstance(template, list):  # [{"name": "default", "template": ...}, ...]
        template = next((t["template"] for t in template if t.get("name") == "default"), None)
    eos_ids = list(eos_token_ids)
    eos_tok = _token_text(cfg.get("eos_token"))
    if eos_tok and (eid := backend.token_to_id(eos_tok)) is not None and eid not in eos_ids:
        eos_ids.append(eid)
    bos_tok = _token_text(cfg.get("bos_token"))
    bos_id = backend.token_to_id(bos_tok) if bos_tok else bos_token_id
    # NOTE(crossway): HF tokenizer.json post-processors add the BOS themselves; we add it in
    # ``encode`` instead, so it is added once whatever the post-processor says.
    backend.no_truncation()
    backend.no_padding()
    add_bos = bool(cfg.get("add_bos_token", _post_processor_adds_bos(backend, bos_id)))
    backend.post_processor = None
    return Tokenizer(backend, bos_token_id=bos_id, eos_token_ids=eos_ids, add_bos=add_bos, chat_template=template)


def _token_text(value: Any) -> str | None:
    if isinstance(value, dict):
        return str(value.get("content"))
    return value if isinstance(value, str) else None


def _post_processor_adds_bos(backend: HFTokenizer, bos_id: int | None) -> bool:
    if bos_id is None or backend.post_processor is None:
        return False
    ids: list[int] = backend.encode("a", add_special_tokens=True).ids
    return bool(ids) and ids[0] == bos_id


def _from_gguf(path: Path) -> Tokenizer:
    reader = gguf_reader(path)
    kind = gguf_field(reader, "tokenizer.ggml.model")
    if kind != "gpt2":
        raise ValueError(f"GGUF tokenizer model {kind!r} is not supported (only byte-level BPE 'gpt2')")
    tokens: list[str] = list(gguf_field(reader, "tokenizer.ggml.tokens"))
    types: list[int] = list(gguf_field(reader, "tokenizer.ggml.token_type", [1] * len(tokens)))
    merges = [tuple(m.split(" ", 1)) for m in gguf_field(reader, "tokenizer.ggml.merges", [])]
    backend = HFTokenizer(
        models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges, fuse_unk=False, byte_fallback=False)
    )
    pre = gguf_field(reader, "tokenizer.ggml.pre", "default")
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=pre not in _SPLIT_BY_PRE)
    if pre in _SPLIT_BY_PRE:
        split = pre_tokenizers.Split(Regex(_SPLIT_BY_PRE[pre]), behavior="isolated")
        backend.pre_tokenizer = pre_tokenizers.Sequence([split, byte_level])
    elif pre in _DIGIT_SPLIT_PRES:
        backend.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    else:
        backend.pre_tokenizer = byte_level
    backend.decoder = decoders.ByteLevel()
    specials = [
        AddedToken(t, special=True, normalized=False) for t, ty in zip(tokens, types, strict=True) if ty == _CONTROL
    ]
    specials += [
        AddedToken(t, special=False, normalized=False)
        for t, ty in zip(tokens, types, strict=True)
        if ty == _USER_DEFINED
    ]
    backend.add_tokens(specials)
    eos = gguf_field(reader, "tokenizer.ggml.eos_token_id")
    eos_ids = [int(eos)] if eos is not None else []
    # ChatML models end a turn with <|im_end|>; stop on it too when the template uses it.
    template = gguf_field(reader, "tokenizer.chat_template")
    im_end = backend.token_to_id("<|im_end|>")
    if template and "<|im_end|>" in template and im_end is not None and im_end not in eos_ids:
        eos_ids.append(im_end)
    bos = gguf_field(reader, "tokenizer.ggml.bos_token_id")
    return Tokenizer(
        backend,
        bos_token_id=None if bos is None else int(bos),
        eos_token_ids=eos_ids,
        add_bos=bool(gguf_field(reader, "tokenizer.ggml.add_bos_token", False)),
        chat_template=template,
    )
