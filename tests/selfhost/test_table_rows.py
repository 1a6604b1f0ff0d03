"""Host staging of block tables (``graphs.TableRows``): rows are rewritten only when their table changed."""

from __future__ import annotations

import numpy as np

from selfhost.graphs import TableRows


def test_table_rows_skip_an_unchanged_table_and_rewrite_a_grown_one() -> None:
    rows = TableRows(np.zeros((2, 6), dtype=np.int32))
    table = [7, 3]
    rows.put(0, table)
    assert rows.array[0, :2].tolist() == [7, 3]
    rows.array[0, :2] = -1  # poison: an unchanged table is not written again
    rows.put(0, table)
    assert rows.array[0, :2].tolist() == [-1, -1]
    table.append(9)  # the request got a block: the row is rewritten
    rows.put(0, table)
    assert rows.array[0, :3].tolist() == [7, 3, 9]


def test_table_rows_rewrite_when_another_request_takes_the_row() -> None:
    rows = TableRows(np.zeros((1, 4), dtype=np.int32))
    rows.put(0, [1, 2])
    rows.put(0, [5, 6])  # an equal-length table of another request (another list object)
    assert rows.array[0, :2].tolist() == [5, 6]
    rows.put(0, [])  # a request with no block yet: nothing to write
    assert rows.array[0, :2].tolist() == [5, 6]


def test_table_rows_copy_a_table_put_on_the_row_before() -> None:
    rows = TableRows(np.zeros((3, 4), dtype=np.int32))
    table = [4, 8, 15]
    rows.put(0, table)
    rows.array[0, 0] = -1  # poison: the next row copies row 0 instead of converting the list
    rows.put(1, table)  # a request's second row in one step
    rows.put(2, [1])
    assert rows.array[:, :3].tolist() == [[-1, 8, 15], [-1, 8, 15], [1, 0, 0]]
    table.append(16)  # grown: not the table row 2 (the last put) holds, so converted again
    rows.put(0, table)
    assert rows.array[0].tolist() == [4, 8, 15, 16]
