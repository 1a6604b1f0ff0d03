"""Bad input gets a clear error and the engine keeps serving."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from selfhost.fetch import resolve_model
from selfhost.sampling import SamplingParams
from tests.selfhost.conftest import chat_ids, make_engine

if TYPE_CHECKING:
    from tests.selfhost.conftest import Loaded


def test_bad_requests_raise_and_engine_keeps_serving(smollm2: Loaded) -> None:
    engine = make_engine(smollm2, max_model_len=128)
    ok = SamplingParams(max_tokens=4, temperature=0)
    with pytest.raises(ValueError, match="the prompt is empty"):
        engine.add_request("empty", [], ok)
    with pytest.raises(ValueError, match="the prompt is empty"):
        engine.add_request("empty-text", "", ok)
    with pytest.raises(ValueError, match="this model's context is 128"):
        engine.add_request("long", [5] * 200, ok)
    with pytest.raises(ValueError, match="lower max_tokens to at most 28"):
        engine.add_request("beyond", [5] * 100, SamplingParams(max_tokens=29))
    with pytest.raises(ValueError, match=r"must be integers in \[0, 49152\)"):
        engine.add_request("vocab", [49152], ok)
    for bad in ([5, -1], [5, 2**40], [5, 1.5]):
        with pytest.raises(ValueError, match=r"must be integers in \[0, 49152\)"):
            engine.add_request("vocab", bad, ok)  # type: ignore[arg-type]
    engine.add_request("dup", [5, 6], ok)
    with pytest.raises(ValueError, match="already live"):
        engine.add_request("dup", [5, 6], ok)
    engine.abort(["dup", "unknown-id"])
    assert not engine.has_unfinished_requests()
    assert len(engine.generate([chat_ids(smollm2, "Hi")], ok)[0]) == 4


def test_unknown_model_name_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="unknown model 'no-such-model'"):
        resolve_model("no-such-model")


def test_max_model_len_beyond_pool_is_a_clear_error(smollm2: Loaded) -> None:
    with pytest.raises(ValueError, match="raise num_kv_blocks"):
        make_engine(smollm2, num_kv_blocks=4, max_model_len=128)
