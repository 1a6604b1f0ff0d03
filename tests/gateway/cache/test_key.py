"""The cache key: canonical, stable across JSON spelling, scoped by tenant, and complete."""

from __future__ import annotations

import msgspec
import pytest

from gateway.cache.key import EXCLUDED, KEYED, SHARED_SCOPE, cache_key, canonical, scope_of
from gateway.types import ChatRequest, Message, ResponseFormat, TextPart, Tool, ToolCall
from gateway.wire import openai as wire


def make_request(**overrides) -> ChatRequest:
    fields = {
        "model": "gpt-test",
        "messages": [Message("system", [TextPart("Be terse.")]), Message("user", [TextPart("ping")])],
        "temperature": 0.0,
    }
    fields.update(overrides)
    return ChatRequest(**fields)


def test_every_request_field_is_keyed_or_excluded_with_a_reason():
    """A new ChatRequest field fails here until it is added to KEYED or to EXCLUDED (with why)."""
    fields = set(ChatRequest.__struct_fields__)
    assert fields == KEYED | set(EXCLUDED), f"decide for: {sorted(fields ^ (KEYED | set(EXCLUDED)))}"
    assert not KEYED & set(EXCLUDED)
    assert all(reason.strip() for reason in EXCLUDED.values())


def test_key_is_stable_across_dict_order_and_json_whitespace_of_the_wire_body():
    a = b"""{"model":"gpt-test","temperature":0,"messages":[{"role":"user","content":"hi"}],
        "tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"x":{"type":"string"},"y":{"type":"number"}}}}}]}"""
    b = b"""{ "tools" : [ { "function" : { "parameters" : { "properties" : { "y" : { "type" : "number" } ,
        "x" : { "type" : "string" } } , "type" : "object" } , "name" : "f" } , "type" : "function" } ] ,
        "messages" : [ { "content" : "hi" , "role" : "user" } ] , "temperature" : 0 , "model" : "gpt-test" }"""
    assert cache_key(wire.decode_chat(a), "gpt-test", "acme") == cache_key(wire.decode_chat(b), "gpt-test", "acme")


def test_key_ignores_whitespace_and_key_order_inside_tool_call_arguments():
    def with_args(arguments: str) -> ChatRequest:
        turn = Message("assistant", tool_calls=[ToolCall("c1", "f", arguments)])
        return make_request(messages=[Message("user", [TextPart("go")]), turn])

    assert canonical(with_args('{"a": 1, "b": [1, 2]}'), "m") == canonical(with_args('{"b":[1,2],"a":1}'), "m")
    assert canonical(with_args('{"a": 1}'), "m") != canonical(with_args('{"a": 2}'), "m")


@pytest.mark.parametrize(
    "change",
    [
        {"temperature": 0.5},
        {"seed": 3},
        {"max_tokens": 10},
        {"top_p": 0.9},
        {"stop": ["x"]},
        {"stream": True},
        {"tools": [Tool("f")]},
        {"response_format": ResponseFormat("json_object")},
        {"messages": [Message("user", [TextPart("ping ")])]},
        {"extra": {"presence_penalty": 0.5}},
    ],
)
def test_key_changes_with_every_field_that_changes_the_answer(change):
    assert cache_key(make_request(), "m", "acme") != cache_key(make_request(**change), "m", "acme")


@pytest.mark.parametrize(
    "change",
    [{"user": "u-1"}, {"wire": "anthropic"}, {"stream_usage": True}, {"extra": {"metadata": {"k": "v"}}}],
)
def test_key_ignores_fields_that_never_change_the_answer(change):
    assert cache_key(make_request(), "m", "acme") == cache_key(make_request(**change), "m", "acme")


def test_tenants_never_share_a_key_unless_the_scope_is_shared():
    request = make_request()
    acme, other = cache_key(request, "m", "acme"), cache_key(request, "m", "other")
    assert acme != other
    assert acme.split(":")[1] != other.split(":")[1]  # the scope is hashed, not only prefixed
    assert scope_of(acme) == "acme"
    assert scope_of(cache_key(request, "m", SHARED_SCOPE)) == SHARED_SCOPE


def test_key_by_alias_or_deployment_gives_different_keys():
    request = make_request()
    assert cache_key(request, "gpt-test", "acme") != cache_key(request, "openai/gpt-4o-mini", "acme")


def test_canonical_bytes_are_sorted_json():
    doc = msgspec.json.decode(canonical(make_request(), "m"))
    assert list(doc) == sorted(doc)


def test_tool_call_arguments_that_are_not_json_are_keyed_as_text():
    def with_args(arguments: str) -> ChatRequest:
        return make_request(messages=[Message("assistant", tool_calls=[ToolCall("c1", "f", arguments)])])

    assert canonical(with_args("{not json"), "m") != canonical(with_args("{not  json"), "m")
    assert canonical(with_args("{not json"), "m") == canonical(with_args("{not json"), "m")
