"""bench.engine_gpu.critical_path: each kernel's share of a step whose kernels overlap (programmatic dependent launch)."""

from bench.engine_gpu import Share, critical_path


def test_critical_path_gives_overlapped_kernels_their_late_end_and_sums_to_the_span():
    events = [
        ("norm", 0.0, 10.0),
        ("gemv", 2.0, 15.0),  # started early, waited: only its 5 us past the norm count
        ("early", 3.0, 8.0),  # ended inside the gemv: no share
        ("attn", 14.0, 16.0),
        ("argmax", 20.0, 21.0),  # the 4 us gap before it is its share too
    ]
    shares = critical_path(events)
    assert shares == [
        Share("norm", 10.0, 10.0),
        Share("gemv", 5.0, 13.0),
        Share("early", 0.0, 5.0),
        Share("attn", 1.0, 2.0),
        Share("argmax", 5.0, 1.0),
    ]
    assert sum(s.share_us for s in shares) == 21.0  # the span, first start to last end


def test_critical_path_of_no_kernels_is_empty():
    assert critical_path([]) == []
