"""The console over a SQLite store whose run holds TEXT that is not valid UTF-8: the run's page and
the run list answer the store-failure page with ``decode_failed``, never the stored bytes.

SQLite only: PostgreSQL refuses invalid UTF-8 on input in a UTF8 database; a SQL_ASCII database (which
would take any bytes) cannot hold a store at all today (opening it fails: psycopg returns its text
as bytes).
"""

from __future__ import annotations

import urllib.error
import urllib.request

import fencepost


def test_pages_of_an_undecodable_run_are_decode_failed(tmp_path):
    from fencepost.ui import create_app
    from fencepost.ui.server import UiServer

    url = f"sqlite:///{tmp_path / 'flows.db'}"
    with fencepost.open(url) as store:
        store.runs.create("r1", '{"flowName": "f"}')
        conn = store.db.connect()
        conn.exec_driver_sql("UPDATE flows_runs SET state_json = "
                             "CAST(x'7b22666c6f774e616d65223a2022666cff77227d' AS TEXT)")
        conn.commit()
        conn.close()
    with UiServer(create_app(url, tick=0.2, poll_interval=1.0)) as server:
        for path in ("/runs/r1", "/"):
            try:
                with urllib.request.urlopen(server.url + path, timeout=10) as resp:
                    status, body = resp.status, resp.read()
            except urllib.error.HTTPError as exc:
                status, body = exc.code, exc.read()
            text = body.decode("utf-8", "replace")
            assert status == 500, (path, status)
            assert "decode_failed" in text or "list_failed" in text, (path, text[-500:])
            assert "\ufffd" not in text and "fl\\xff" not in text and "OperationalError" not in text
