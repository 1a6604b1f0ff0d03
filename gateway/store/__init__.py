"""The gateway's database: connection, tables, migrations, and the tenant and API-key store.

Modules: ``db`` (engine and sessions), ``models`` (tables), ``migrate`` (Alembic upgrades) and ``keys``
(tenants and API keys).

Nothing outside this package writes SQL for these tables; callers go through ``KeyStore``.
"""
