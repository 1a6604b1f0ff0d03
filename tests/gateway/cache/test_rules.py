"""The policy's ``cache`` section: defaults, YAML's bare on/off, and errors that name the key."""

from __future__ import annotations

import re

import pytest

from gateway.policy import CacheRules, PolicyError, parse_policy


def test_a_policy_without_a_cache_section_turns_the_cache_off():
    rules = parse_policy("", {}).cache
    assert rules == CacheRules()
    assert rules.mode == "off" and not rules.reads and not rules.writes


@pytest.mark.parametrize(
    ("text", "mode", "reads", "writes"),
    [
        ("cache: {mode: on}", "on", True, True),  # YAML 1.1 reads a bare on as true
        ("cache: {mode: off}", "off", False, False),
        ("cache: {mode: 'on'}", "on", True, True),
        ("cache: {mode: read_only}", "read_only", True, False),
        ("cache: {mode: write_only}", "write_only", False, True),
    ],
)
def test_cache_mode_compiles_to_what_may_be_read_and_written(text, mode, reads, writes):
    rules = parse_policy(text, {}).cache
    assert (rules.mode, rules.reads, rules.writes) == (mode, reads, writes)


def test_every_cache_option_is_compiled():
    text = (
        "cache: {mode: on, ttl_s: 60, cacheable: opt_in, shared_across_tenants: true, key_by: deployment,"
        " max_entry_bytes: 2048, flight_wait_s: 5}"
    )
    assert parse_policy(text, {}).cache == CacheRules("on", 60.0, "opt_in", True, "deployment", 2048, 5.0)


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("cache: {mode: maybe}", "$.cache.mode"),
        ("cache: {ttl_s: 0}", "$.cache.ttl_s"),
        ("cache: {cacheable: sometimes}", "$.cache.cacheable"),
        ("cache: {key_by: region}", "$.cache.key_by"),
        ("cache: {ttl: 5}", "$.cache"),
    ],
)
def test_an_invalid_cache_section_fails_naming_the_key(text, where):
    with pytest.raises(PolicyError, match=re.escape(f"`{where}")):
        parse_policy(text, {}, source="p.yaml")
