"""Crossway's self-hosted inference engine.

Owns the model, weight and tokenizer loading, the scheduler with continuous batching, the paged
KV cache with prefix caching, sampling, the async engine and its own OpenAI-compatible server.
Never imports ``gateway``; the gateway imports this package (see ``selfhost.api`` for the surface).
"""
