"""``fencepost demo`` end to end through the real executable, then the other commands on what it leaves."""

from __future__ import annotations

import json
import time
import uuid

import fencepost
from fencepost.journal import verify
from tests.conftest import drop_schema, require_postgres


def test_demo_on_the_embedded_default_finishes_and_leaves_an_explorable_database(run_cli, tmp_path):
    started = time.monotonic()
    result = run_cli("demo", "--runs", "60", "--workers", "3", "--speed", "20", cwd=tmp_path, timeout=120)
    assert result.code == 0, result
    assert time.monotonic() - started < 60
    out = result.out
    assert "SIGKILLed worker" in out
    assert "takeovers:" in out and "journal verified: yes" in out
    assert "in step with the source: yes" in out
    db = tmp_path / ".flows" / "flows.db"
    assert db.exists()

    url = f"sqlite:///{db}"
    with fencepost.open(url, readonly=True) as store:
        assert verify(store).ok
    listed = json.loads(run_cli("runs", "list", "--json", "--limit", "1000", cwd=tmp_path).out)["runs"]
    assert len(listed) == 60
    statuses = {r["status"] for r in listed}
    assert statuses <= {"completed", "failed", "cancelled"} and "cancelled" in statuses
    assert run_cli("journal", "verify", cwd=tmp_path).code == 0
    some = listed[0]["run_id"]
    assert run_cli("journal", "replay", some, cwd=tmp_path).code == 0
    status = json.loads(run_cli("projection", "status", "--json", cwd=tmp_path).out)
    assert status["lag"] == 0


def test_demo_runs_on_postgresql(run_cli):
    """The same main job with ``--db`` naming a PostgreSQL schema."""
    base = require_postgres()
    schema = "t_" + uuid.uuid4().hex[:16]
    db_url = f"{base}?schema={schema}"
    try:
        result = run_cli("--db", db_url, "demo", "--runs", "40", "--workers", "3", "--speed", "20", timeout=120)
    finally:
        drop_schema(base, schema)
    assert result.code == 0, result
    assert "journal verified: yes" in result.out and "in step with the source: yes" in result.out
