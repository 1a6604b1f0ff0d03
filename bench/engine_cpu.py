"""CPU benchmark: Crossway engine vs HF transformers on SmolLM2-135M (fp32), same process."""

from __future__ import annotations

import argparse
import time

import torch

from selfhost.config import EngineConfig
from selfhost.engine import LLMEngine
from selfhost.sampling import SamplingParams


def decode_rate(engine: LLMEngine, prompts: list[list[int]], n: int) -> float:
    params = SamplingParams(max_tokens=n, temperature=0, ignore_eos=True)
    for i, p in enumerate(prompts):
        engine.add_request(f"d{time.monotonic_ns()}-{i}", p, params)
    while any(r.num_output_tokens == 0 for r in engine.scheduler.requests.values()):
        engine.step()  # prefill (+ first token) outside the timed window
    start, produced = time.perf_counter(), 0
    while engine.has_unfinished_requests():
        produced += len(engine.step())
    return produced / (time.perf_counter() - start)


def ttft(engine: LLMEngine, prompt: list[int]) -> float:
    start = time.perf_counter()
    engine.add_request(f"t{time.monotonic_ns()}", prompt, SamplingParams(max_tokens=1, temperature=0))
    while engine.has_unfinished_requests():
        engine.step()
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--dtype", default="float32")
    args = ap.parse_args()
    engine = LLMEngine.from_model(
        "smollm2", EngineConfig(dtype=args.dtype, max_num_batched_tokens=1024, num_kv_blocks=512)
    )
    tok = engine.tokenizer
    assert tok is not None
    prompts = [
        tok.encode_chat([{"role": "user", "content": f"Tell me story number {i} about a dragon."}]) for i in range(16)
    ]
    decode_rate(engine, prompts[:1], 8)  # warm up
    ours1 = decode_rate(engine, prompts[:1], args.tokens)
    ours16 = decode_rate(engine, prompts, args.tokens)
    system = "You are a careful assistant. " * 170  # ~1,000 tokens
    long_prompt = tok.encode_chat([{"role": "system", "content": system}, {"role": "user", "content": "Hi"}])
    other = tok.encode_chat([{"role": "system", "content": system}, {"role": "user", "content": "Hello again"}])
    cold = ttft(engine, long_prompt)
    hit = ttft(engine, other)

    from transformers import AutoModelForCausalLM

    path = engine.model_name
    from selfhost.fetch import resolve_model

    gguf = resolve_model(path)
    hf = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32).eval()
    ids = torch.tensor([prompts[0]])
    with torch.inference_mode():
        hf.generate(ids, max_new_tokens=4, min_new_tokens=4, do_sample=False, pad_token_id=2)
        out = hf(ids, use_cache=True)
        past, nxt = out.past_key_values, out.logits[:, -1:].argmax(-1)
        start = time.perf_counter()
        for _ in range(args.tokens):
            out = hf(nxt, past_key_values=past, use_cache=True)
            past, nxt = out.past_key_values, out.logits[:, -1:].argmax(-1)
        hf1 = args.tokens / (time.perf_counter() - start)
    print(f"prompt tokens: short {len(prompts[0])}, long {len(long_prompt)}; threads {torch.get_num_threads()}")
    print(f"decode bs1 tok/s   ours {ours1:.1f}   HF eager {hf1:.1f}   ratio {ours1 / hf1:.2f}x")
    print(f"aggregate bs16 tok/s ours {ours16:.1f}   vs HF bs1 {ours16 / hf1:.2f}x")
    print(f"TTFT 1k-token prompt cold {cold * 1e3:.0f} ms   prefix hit {hit * 1e3:.0f} ms   ratio {cold / hit:.1f}x")


if __name__ == "__main__":
    main()
