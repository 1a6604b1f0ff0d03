"""Chained hashes of full KV blocks, the keys of the prefix cache.

Owns how a block's identity is computed: ``sha256(parent_hash | token ids as int32 | extra keys)``,
so a block hash names the block *and its whole prefix*. The tenant salt enters the first block only
and flows down the chain. Does not own which blocks hold which hash (``kv_cache``).
"""

from __future__ import annotations

import hashlib
import struct
from typing import TYPE_CHECKING, NewType, cast

if TYPE_CHECKING:
    from collections.abc import Sequence

BlockHash = NewType("BlockHash", bytes)
"""32-byte sha256 digest naming a full block and its prefix."""

ROOT_HASH = BlockHash(b"\x00" * 32)
"""The parent of every sequence's first block."""


def hash_block(parent: BlockHash, token_ids: Sequence[int], extra_keys: Sequence[str] = ()) -> BlockHash:
    """Hash one full block given its parent's hash, its token ids and extra keys (e.g. a tenant salt)."""
    return _hash(parent, pack_token_ids(token_ids), extra_keys)


def _hash(parent: BlockHash, token_bytes: bytes, extra_keys: Sequence[str]) -> BlockHash:
    data = parent + token_bytes
    for key in extra_keys:
        raw = key.encode()
        data += struct.pack("<q", len(raw)) + raw  # length-prefixed: ("ab", "c") != ("a", "bc")
    return BlockHash(hashlib.sha256(data).digest())


def pack_token_ids(token_ids: Sequence[int]) -> bytes:
    """Token ids as the blocks hash them: int32, little-endian.

    Raises:
        struct.error: an id is not an integer or lies outside int32.
    """
    return struct.pack(f"<{len(token_ids)}i", *token_ids)


def extend_block_hashes(
    hashes: list[BlockHash],
    token_ids: Sequence[int],
    block_size: int,
    salt: str | None = None,
    num_blocks: int | None = None,
    packed: bytes = b"",
) -> list[BlockHash]:
    """Append the hashes of blocks of ``token_ids`` that became full since ``hashes`` was last extended.

    Mutates and returns ``hashes``; a partial trailing block is never hashed. ``num_blocks`` stops at
    that many hashes (a long prompt's blocks are hashed as its chunks are scheduled, not all at once).
    ``packed`` is ``pack_token_ids`` of a leading part of ``token_ids`` (the prompt's, packed once
    when it was validated), read instead of packing those ids again.
    """
    full = len(token_ids) // block_size
    end = full if num_blocks is None else min(full, num_blocks)
    start = len(hashes)
    if end <= start:
        return hashes
    # NOTE(crossway): token ids as int32, packed once for all new blocks: a 16-token block and its
    # parent then fill two 64-byte SHA-256 rounds instead of three (0.7 instead of 1.3 us a block
    # in a 37-block call); caching's host cost per offline run fell from ~61 to ~55 ms
    # (bench/prefix_cache_cost.py), where the rest is the per-step bookkeeping around it
    width = 4 * block_size
    if end * width <= len(packed):
        raw = packed[start * width : end * width]
    else:
        raw = pack_token_ids(token_ids[start * block_size : end * block_size])
    out = cast("list[bytes]", hashes)  # appended to in place, without a BlockHash() call per block
    parent: bytes = hashes[-1] if hashes else ROOT_HASH
    first = 0
    if start == 0 and salt is not None:  # the salt enters the first block only
        parent = _hash(ROOT_HASH, raw[:width], (salt,))
        out.append(parent)
        first = width
    sha256 = hashlib.sha256
    for offset in range(first, len(raw), width):
        parent = sha256(parent + raw[offset : offset + width]).digest()  # _hash without extra keys
        out.append(parent)
    return hashes
