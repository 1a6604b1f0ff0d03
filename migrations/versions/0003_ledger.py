"""The usage ledger: usage records, versioned prices, per-tenant and per-key limits and budgets.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-23
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "usage_records",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("ts", sa.DateTime(timezone=True), nullable=False),
        sa.Column("request_id", sa.String(length=128), nullable=False),
        sa.Column("tenant", sa.String(length=64), nullable=True),
        sa.Column("tenant_id", sa.Integer(), nullable=True),
        sa.Column("key_id", sa.Integer(), nullable=True),
        sa.Column("endpoint", sa.String(length=32), nullable=False),
        sa.Column("alias", sa.String(length=256), nullable=False),
        sa.Column("provider", sa.String(length=64), nullable=True),
        sa.Column("deployment", sa.String(length=256), nullable=True),
        sa.Column("slo_class", sa.String(length=64), nullable=False),
        sa.Column("streamed", sa.Boolean(), nullable=False),
        sa.Column("input_tokens", sa.Integer(), nullable=False),
        sa.Column("cached_input_tokens", sa.Integer(), nullable=False),
        sa.Column("cache_write_tokens", sa.Integer(), nullable=False),
        sa.Column("output_tokens", sa.Integer(), nullable=False),
        sa.Column("usage_source", sa.String(length=16), nullable=False),
        sa.Column("price_id", sa.Integer(), nullable=True),
        sa.Column("cost_nanos", sa.BigInteger(), nullable=False),
        sa.Column("saved_nanos", sa.BigInteger(), nullable=False),
        sa.Column("queue_ms", sa.Float(), nullable=True),
        sa.Column("ttft_ms", sa.Float(), nullable=True),
        sa.Column("tpot_ms", sa.Float(), nullable=True),
        sa.Column("latency_ms", sa.Float(), nullable=False),
        sa.Column("slo_met", sa.Boolean(), nullable=True),
        sa.Column("status", sa.Integer(), nullable=False),
        sa.Column("error", sa.String(length=64), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_usage_records")),
    )
    op.create_index(op.f("ix_usage_records_ts"), "usage_records", ["ts"], unique=False)
    op.create_index(op.f("ix_usage_records_request_id"), "usage_records", ["request_id"], unique=False)
    op.create_index("ix_usage_records_tenant_ts", "usage_records", ["tenant", "ts"], unique=False)
    op.create_table(
        "prices",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("deployment", sa.String(length=256), nullable=False),
        sa.Column("effective_from", sa.DateTime(timezone=True), nullable=False),
        sa.Column("input", sa.Float(), nullable=False),
        sa.Column("output", sa.Float(), nullable=False),
        sa.Column("cached_input", sa.Float(), nullable=True),
        sa.Column("author", sa.String(length=128), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_prices")),
    )
    op.create_index("ix_prices_deployment_effective_from", "prices", ["deployment", "effective_from"], unique=False)
    op.create_table(
        "tenant_limits",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("tenant", sa.String(length=64), nullable=False),
        sa.Column("key_id", sa.Integer(), nullable=False),
        sa.Column("rpm", sa.Integer(), nullable=True),
        sa.Column("tpm", sa.Integer(), nullable=True),
        sa.Column("budget_soft_usd", sa.Float(), nullable=True),
        sa.Column("budget_hard_usd", sa.Float(), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tenant_limits")),
        sa.UniqueConstraint("tenant", "key_id", name=op.f("uq_tenant_limits_tenant")),
    )


def downgrade() -> None:
    op.drop_table("tenant_limits")
    op.drop_index("ix_prices_deployment_effective_from", table_name="prices")
    op.drop_table("prices")
    op.drop_index("ix_usage_records_tenant_ts", table_name="usage_records")
    op.drop_index(op.f("ix_usage_records_request_id"), table_name="usage_records")
    op.drop_index(op.f("ix_usage_records_ts"), table_name="usage_records")
    op.drop_table("usage_records")
