"""Chained hashes of full KV blocks, the keys of the prefix cache.

Owns how a block's identity is computed: ``sha256(parent_hash | token ids | extra keys)``, so a
block hash names the block *and its whole prefix*. The tenant salt enters the first block only and
flows down the chain. Does not own which blocks hold which hash (``kv_cache``).
"""

from __future__ import annotations

import hashlib
import struct
from typing import TYPE_CHECKING, NewType

if TYPE_CHECKING:
    from collections.abc import Sequence

BlockHash = NewType("BlockHash", bytes)
"""32-byte sha256 digest naming a full block and its prefix."""

ROOT_HASH = BlockHash(b"\x00" * 32)
"""The parent of every sequence's first block."""


def hash_block(parent: BlockHash, token_ids: Sequence[int], extra_keys: Sequence[str] = ()) -> BlockHash:
    """Hash one full block given its parent's hash, its token ids and extra keys (e.g. a tenant salt)."""
    h = hashlib.sha256(parent)
    h.update(struct.pack(f"<{len(token_ids)}q", *token_ids))
    for key in extra_keys:
        raw = key.encode()
        h.update(struct.pack("<q", len(raw)) + raw)  # length-prefixed: ("ab", "c") != ("a", "bc")
    return BlockHash(h.digest())


def extend_block_hashes(
    hashes: list[BlockHash],
    token_ids: Sequence[int],
    block_size: int,
    salt: str | None = None,
    num_blocks: int | None = None,
) -> list[BlockHash]:
    """Append the hashes of blocks of ``token_ids`` that became full since ``hashes`` was last extended.

    Mutates and returns ``hashes``; a partial trailing block is never hashed. ``num_blocks`` stops at
    that many hashes (a long prompt's blocks are hashed as its chunks are scheduled, not all at once).
    """
    full = len(token_ids) // block_size
    for i in range(len(hashes), full if num_blocks is None else min(full, num_blocks)):
        parent = hashes[i - 1] if i else ROOT_HASH
        extra = (salt,) if (i == 0 and salt is not None) else ()
        hashes.append(hash_block(parent, token_ids[i * block_size : (i + 1) * block_size], extra))
    return hashes
