"""Shared fixtures: the real SmolLM2 model (fetched once, loaded once per session), its HF twin, engine builders."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import pytest
import torch

from selfhost.config import EngineConfig, ModelConfig
from selfhost.engine import LLMEngine
from selfhost.fetch import resolve_model
from selfhost.loader import load_model, load_model_config
from selfhost.tokenizer import Tokenizer, load_tokenizer

if TYPE_CHECKING:
    from pathlib import Path

    from selfhost.models.llama import LlamaForCausalLM

CHAT_PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain gravity in one sentence.",
    "List three primary colors.",
    "What is 12 + 35?",
    "Translate 'good morning' into Spanish.",
    "Give me a name for a pet turtle.",
    "Why is the sky blue?",
    "Write one line of Python that prints hello.",
    "What do bees make?",
    "Name a famous painter.",
    "How many legs does a spider have?",
]


@pytest.fixture(autouse=True)
def _seed() -> None:
    """Each test draws the same numbers from torch's shared generator whatever ran before it in its worker."""
    torch.manual_seed(0)


@dataclass(frozen=True)
class Loaded:
    path: Path
    config: ModelConfig
    model: LlamaForCausalLM
    tokenizer: Tokenizer


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    return resolve_model("smollm2", progress=False)


@pytest.fixture(scope="session")
def smollm2(smollm2_path: Path) -> Loaded:
    torch.manual_seed(0)
    cfg = load_model_config(smollm2_path)
    model = load_model(smollm2_path, cfg, torch.float32, 2048)
    return Loaded(smollm2_path, cfg, model, load_tokenizer(smollm2_path))


@pytest.fixture(scope="session")
def hf_smollm2(smollm2_path: Path) -> Any:
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging

    logging.disable_progress_bar()
    return AutoModelForCausalLM.from_pretrained(
        str(smollm2_path.parent), gguf_file=smollm2_path.name, dtype=torch.float32
    ).eval()


def make_engine(loaded: Loaded, **overrides: Any) -> LLMEngine:
    """An engine over the shared model weights with a small KV pool (the pool is per engine)."""
    cfg = replace(EngineConfig(num_kv_blocks=256, max_model_len=2048), **overrides)
    return LLMEngine(loaded.model, loaded.config, loaded.tokenizer, cfg, model_name="smollm2")


def chat_ids(loaded: Loaded, text: str, system: str | None = None) -> list[int]:
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": text}]
    return loaded.tokenizer.encode_chat(messages)
