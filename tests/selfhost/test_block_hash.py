from __future__ import annotations

import hashlib
import struct

from selfhost.block_hash import ROOT_HASH, extend_block_hashes, hash_block, pack_token_ids


def test_hash_block_is_sha256_of_parent_tokens_and_keys() -> None:
    expected = hashlib.sha256(ROOT_HASH + struct.pack("<3i", 1, 2, 3) + struct.pack("<q", 1) + b"t").digest()
    assert hash_block(ROOT_HASH, [1, 2, 3], ("t",)) == expected


def test_hash_chains_parent_so_equal_blocks_after_different_prefixes_differ() -> None:
    a = extend_block_hashes([], [1, 2, 3, 4, 5, 6], block_size=3)
    b = extend_block_hashes([], [9, 9, 9, 4, 5, 6], block_size=3)
    assert a[1] != b[1]
    assert a[1] == hash_block(a[0], [4, 5, 6])


def test_extend_block_hashes_skips_partial_block_and_extends_incrementally() -> None:
    tokens = [1, 2, 3, 4, 5]
    hashes = extend_block_hashes([], tokens, block_size=2)
    assert len(hashes) == 2
    first = list(hashes)
    tokens.append(6)
    extend_block_hashes(hashes, tokens, block_size=2)
    assert hashes[:2] == first
    assert hashes == extend_block_hashes([], tokens, block_size=2)


def test_salt_changes_every_block_hash_through_the_chain() -> None:
    tokens = list(range(8))
    plain = extend_block_hashes([], tokens, 4)
    salted = extend_block_hashes([], tokens, 4, salt="tenant-a")
    other = extend_block_hashes([], tokens, 4, salt="tenant-b")
    assert len({plain[0], salted[0], other[0]}) == 3
    assert len({plain[1], salted[1], other[1]}) == 3


def test_extra_keys_are_length_prefixed() -> None:
    assert hash_block(ROOT_HASH, [1], ("ab", "c")) != hash_block(ROOT_HASH, [1], ("a", "bc"))


def test_hashes_read_from_the_packed_prompt_equal_those_packed_again_and_extend_past_it() -> None:
    prompt = [7, 300, 5, 49151, 0, 12, 9]
    packed = pack_token_ids(prompt)
    assert packed == struct.pack("<7i", *prompt)
    tokens = [*prompt, 4, 4, 4]  # three output tokens: the third block fills past the packed prompt
    assert extend_block_hashes([], tokens, 3, "t", packed=packed) == extend_block_hashes([], tokens, 3, "t")
    assert extend_block_hashes([], tokens, 3, packed=packed, num_blocks=2) == extend_block_hashes([], tokens[:6], 3)
