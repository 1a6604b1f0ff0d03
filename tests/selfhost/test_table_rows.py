"""Host staging of block tables (``graphs.TableRows``): a row gets only the ids it does not hold yet."""

from __future__ import annotations

import numpy as np

from selfhost.graphs import TableRows


def test_table_rows_skip_an_unchanged_table_and_write_only_a_grown_tail() -> None:
    rows = TableRows(np.zeros((2, 6), dtype=np.int32))
    table = [7, 3]
    rows.put(0, table)
    assert rows.array[0, :2].tolist() == [7, 3]
    rows.array[0, :2] = -1  # poison: ids the row holds already are not written again
    rows.put(0, table)
    assert rows.array[0, :2].tolist() == [-1, -1]
    table.append(9)  # the request got a block: only that id is written
    rows.put(0, table)
    assert rows.array[0, :3].tolist() == [-1, -1, 9]


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


def test_table_rows_copy_tables_that_shift_up_when_a_request_ahead_finishes() -> None:
    rows = TableRows(np.zeros((3, 5), dtype=np.int32))
    a, b, c = [1, 2], [3, 4, 5], [6]
    rows.put_all([a, b, c])
    rows.array[1:, 0] = -1  # poison: the shifted rows are copied, not converted from the lists
    b.append(9)  # and one grew meanwhile: its copy gets the new tail from the list
    rows.put_all([b, c])  # a finished
    assert rows.array[0].tolist() == [-1, 4, 5, 9, 0]
    assert rows.array[1, :1].tolist() == [-1]


def test_table_rows_convert_a_table_whose_row_was_overwritten() -> None:
    rows = TableRows(np.zeros((2, 3), dtype=np.int32))
    a, b = [1, 2], [3]
    rows.put_all([a, b])
    rows.put(0, b)  # a's row now holds b: a's ids can only come from its list
    rows.put(1, a)
    assert rows.array[:, :2].tolist() == [[3, 2], [1, 2]]


def test_table_rows_put_all_from_a_first_row_skips_the_tables_those_rows_hold() -> None:
    rows = TableRows(np.zeros((4, 3), dtype=np.int32))
    a, b = [1, 2], [3]
    rows.put_all([a, b], first_row=2)  # the step graphs' decode rows follow the multi-token slots
    assert rows.array[2:, :2].tolist() == [[1, 2], [3, 0]]
    rows.array[2:, 0] = -1  # poison: held tables are not written again, a grown one gets its tail
    a.append(7)
    rows.put_all([a, b], first_row=2)
    assert rows.array[2:].tolist() == [[-1, 2, 7], [-1, 0, 0]]
    assert rows.array[:2].tolist() == [[0, 0, 0], [0, 0, 0]]
