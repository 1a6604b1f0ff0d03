"""A step's rows as the decode graphs take them (``runner._Flat.per_row``): one table and one source a row."""

from __future__ import annotations

from selfhost.runner import _Flat


def test_per_row_repeats_a_requests_table_over_its_rows_and_keeps_pending_sources() -> None:
    # a decode row (pending id in last_tokens[5]), a three-token prefix-hit tail, then another decode row
    flat = _Flat(
        ids=[0, 11, 12, 13, 0],
        positions=[9, 32, 33, 34, 4],
        slots=[37, 12, 13, 14, 20],
        query_start=[0, 1, 4, 5],
        seq_lens=[10, 35, 5],
        tables=[[3, 7, 9], [0, 1, 2], [5]],
        logits_rows=[0, 3, 4],
        pending_rows=[0, 4],
        pending_sources=[5, 1],
    )
    tables, sources = flat.per_row()
    assert tables == [[3, 7, 9], [0, 1, 2], [0, 1, 2], [0, 1, 2], [5]]
    assert sources == [5, -1, -1, -1, 1]
