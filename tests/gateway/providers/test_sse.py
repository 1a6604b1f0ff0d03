import httpx
import pytest

from gateway.providers.base import SSEvent, iter_sse

RAW = (
    b"event: a\r\ndata: 1\r\n\r\n: a comment\ndata: x\ndata: y\n\nevent: b\rdata: 2\r\r"
    b"data: \xc3\xa9t\xc3\xa9\n\ndata: unterminated"
)
EXPECTED = [
    SSEvent("a", "1"),
    SSEvent(None, "x\ny"),
    SSEvent("b", "2"),
    SSEvent(None, "été"),
    SSEvent(None, "unterminated"),
]


class _Chunks(httpx.AsyncByteStream):
    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks

    async def __aiter__(self):
        for chunk in self.chunks:
            yield chunk


@pytest.mark.parametrize("split", range(1, len(RAW)))
async def test_iter_sse_parses_events_whatever_the_chunk_boundaries(split):
    """Any cut, even inside \\r\\n or a UTF-8 character, gives the same events."""
    response = httpx.Response(200, stream=_Chunks([RAW[:split], RAW[split:]]))
    assert [e async for e in iter_sse(response)] == EXPECTED


async def test_iter_sse_yields_each_event_as_its_chunk_arrives():
    response = httpx.Response(200, stream=_Chunks([b"data: 1\n\n", b"data: 2\n\n"]))
    events = iter_sse(response)
    assert await anext(events) == SSEvent(None, "1")
    assert await anext(events) == SSEvent(None, "2")
