"""Tokenizers built from GGUF metadata and from tokenizer.json, and chat templates, against HF transformers."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import pytest
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers

from selfhost.tokenizer import load_tokenizer

if TYPE_CHECKING:
    from pathlib import Path

    from tests.selfhost.conftest import Loaded

TEXTS = [
    "Hello, world!",
    "What is 12+35? Answer: 47.",
    "  leading spaces and\ttabs\nnew lines\n\n",
    "naïve café — ünïcödé ✓ 日本語",
    "<|im_start|>user\nhi<|im_end|>",
]


@pytest.mark.slow
def test_gguf_tokenizer_matches_hf_transformers(smollm2: Loaded) -> None:
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(smollm2.path.parent), gguf_file=smollm2.path.name)
    for text in TEXTS:
        ours = smollm2.tokenizer.encode(text, add_special_tokens=False)
        assert ours == hf.encode(text, add_special_tokens=False), text
        assert smollm2.tokenizer.decode(ours, skip_special_tokens=False) == text
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
    assert smollm2.tokenizer.encode_chat(messages) == hf.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=False
    )


def test_gguf_tokenizer_special_ids(smollm2: Loaded) -> None:
    tok = smollm2.tokenizer
    assert (tok.bos_token_id, tok.eos_token_ids, tok.add_bos) == (1, (2,), False)
    assert tok.encode("<|im_start|>", add_special_tokens=False) == [1]
    assert tok.decode([1, 28, 2]) == ","  # special tokens skipped


def test_chat_template_renders_default_system_prompt(smollm2: Loaded) -> None:
    text = smollm2.tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}])
    assert text == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )


def test_tokenizer_json_folder_with_bos_and_template(tmp_path: Path) -> None:
    vocab = {"<s>": 0, "</s>": 1, **{chr(c): c - 30 for c in range(ord("a"), ord("z") + 1)}, "Ġ": 100}
    backend = HFTokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(["<s>", "</s>"])
    backend.save(str(tmp_path / "tokenizer.json"))
    template = "{{ bos_token }}{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}{{ eos_token }}{% endfor %}"
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps({"bos_token": "<s>", "eos_token": "</s>", "add_bos_token": True, "chat_template": template})
    )
    tok = load_tokenizer(tmp_path)
    assert tok.encode("ab") == [0, vocab["a"], vocab["b"]]
    assert tok.encode("ab", add_special_tokens=False) == [vocab["a"], vocab["b"]]
    assert tok.eos_token_ids == (1,)
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}]) == "<s>user: hi</s>"
    assert tok.decode(tok.encode("a b")) == "a b"


def test_missing_chat_template_is_a_clear_error(tmp_path: Path) -> None:
    backend = HFTokenizer(models.BPE(vocab={"a": 0}, merges=[]))
    backend.save(str(tmp_path / "tokenizer.json"))
    tok = load_tokenizer(tmp_path)
    with pytest.raises(ValueError, match="no chat template"):
        tok.apply_chat_template([{"role": "user", "content": "hi"}])


def test_text_stream_releases_whole_characters_and_adds_up_to_the_decoded_text(smollm2: Loaded) -> None:
    """Token by token, after a prompt's tail: the deltas join to ``decode``'s text, and a character
    split over several byte tokens comes out only once complete."""
    tok = smollm2.tokenizer
    context = tok.encode("User: say it\nAssistant:", add_special_tokens=False)
    for text in [*TEXTS[:4], " 🙂 and 🚀, 東京"]:
        ids = tok.encode(text, add_special_tokens=False)
        stream = tok.text_stream(context[-6:])
        deltas = [stream.step(i) for i in ids]
        assert "".join(deltas) == tok.decode([*context, *ids])[len(tok.decode(context)) :], text
        assert all("\ufffd" not in d for d in deltas)
    pieces = tok.encode(" 東京", add_special_tokens=False)  # byte-level pieces of two characters
    stream = tok.text_stream()
    assert [stream.step(i) for i in pieces] == ["", "", " 東", "", "京"]
