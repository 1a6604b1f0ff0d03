"""Model definitions in plain PyTorch; each forward runs over a flattened batch with a paged KV cache."""
