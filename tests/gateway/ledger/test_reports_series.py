"""Finance reports as series over days (the dashboard's charts), on SQLite and PostgreSQL."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import pytest

from gateway.ledger.reports import goodput, spend
from gateway.ledger.writer import LedgerWriter
from tests.gateway.ledger.helpers import make_record

if TYPE_CHECKING:
    from gateway.ledger.record import UsageRecord
    from gateway.store.db import Database

DAY1 = datetime(2026, 3, 9, tzinfo=UTC)
DAY2 = DAY1 + timedelta(days=1)
_IDS = itertools.count()


def _record(**overrides: Any) -> UsageRecord:
    return make_record(request_id=f"series-{next(_IDS)}", **overrides)


async def _write(db: Database, records: list[UsageRecord]) -> None:
    writer = LedgerWriter(db)
    writer.start()
    for record in records:
        writer.submit(record)
    await writer.aclose()


async def test_goodput_by_day_gives_share_quantiles_and_rate_per_day(db: Database) -> None:
    await _write(db, [
        _record(ts=DAY1 + timedelta(hours=1), slo_met=True, ttft_ms=100.0, tpot_ms=10.0, cost_nanos=3000),
        _record(ts=DAY1 + timedelta(hours=2), slo_met=False, ttft_ms=900.0, tpot_ms=30.0, cost_nanos=5000),
        _record(ts=DAY1 + timedelta(hours=23, minutes=59), slo_met=True, ttft_ms=200.0, tpot_ms=20.0, cost_nanos=1000),
        _record(ts=DAY2 + timedelta(hours=5), tenant="globex", slo_met=True, cost_nanos=7000),
        _record(ts=DAY2 + timedelta(hours=6), deployment=None, provider=None, status=503, cost_nanos=0),
    ])  # fmt: skip
    rows = await goodput(db, DAY1, DAY2 + timedelta(hours=12), ["day"])
    assert [(r["day"], r["requests"], r["slo_met"]) for r in rows] == [("2026-03-09", 3, 2), ("2026-03-10", 1, 1)]
    first, second = rows
    assert first["slo_met_share"] == pytest.approx(2 / 3)
    assert (first["ttft_p50_ms"], first["ttft_p95_ms"], first["tpot_p99_ms"]) == (200.0, 900.0, 30.0)
    assert first["cost_per_slo_met_usd"] == pytest.approx(9000 / 2 / 1e9)
    assert first["goodput_rps"] == pytest.approx(2 / 86400)
    # the range ends at noon of the second day: its rate is over those 12 hours, not a whole day
    assert second["goodput_rps"] == pytest.approx(1 / (12 * 3600))
    assert second["ttft_p50_ms"] is None  # a non-streamed record has no TTFT


async def test_goodput_by_tenant_and_day_splits_each_day_per_tenant(db: Database) -> None:
    await _write(db, [
        _record(ts=DAY1 + timedelta(hours=1), tenant="acme", slo_met=True),
        _record(ts=DAY1 + timedelta(hours=2), tenant="globex", slo_met=False),
        _record(ts=DAY2 + timedelta(hours=1), tenant="acme", slo_met=False),
    ])  # fmt: skip
    rows = await goodput(db, DAY1, DAY2 + timedelta(days=1), ["tenant", "day"])
    assert [(r["tenant"], r["day"], r["slo_met_share"]) for r in rows] == [
        ("acme", "2026-03-09", 1.0), ("acme", "2026-03-10", 0.0), ("globex", "2026-03-09", 0.0),
    ]  # fmt: skip
    assert "deployment" not in rows[0]


async def test_goodput_and_spend_name_the_same_days(db: Database) -> None:
    """The dashboard joins spend and goodput by day; both must spell a day the same way on every back-end."""
    await _write(db, [_record(ts=DAY1 + timedelta(hours=h), slo_met=True) for h in (0, 23)])
    await _write(db, [_record(ts=DAY2, slo_met=True)])
    by_spend = sorted(r["day"] for r in await spend(db, DAY1, DAY2 + timedelta(days=1), ["day"]))
    by_goodput = [r["day"] for r in await goodput(db, DAY1, DAY2 + timedelta(days=1), ["day"])]
    assert by_spend == by_goodput == ["2026-03-09", "2026-03-10"]


async def test_goodput_default_groups_stay_tenant_deployment_and_class(db: Database) -> None:
    await _write(db, [_record(ts=DAY1, slo_met=True, slo_class="interactive")])
    (row,) = await goodput(db, DAY1, DAY2)
    assert (row["tenant"], row["deployment"], row["slo_class"], row["requests"]) == (
        "acme", "openai/gpt-4o-mini", "interactive", 1,
    )  # fmt: skip
    assert "day" not in row
