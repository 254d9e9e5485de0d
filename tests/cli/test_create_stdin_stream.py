"""``runs create -`` reads its stdin without click's deprecated stream helper, on SQLite and PostgreSQL.

It took its input from ``click.get_binary_stream("stdin")``, which the click this project installs
(8.5) deprecates, with a ``DeprecationWarning`` on every call, and click 9.0 removes: pyproject
accepts any click from 8.1 on, so under click 9 ``runs create -`` would fail on an AttributeError
before reading a line. It now reads ``sys.stdin.buffer``, the bytes under the text stream, as that
helper did. (mypy found it: click's module ``__getattr__`` types the deprecated name ``object``.)
"""

from __future__ import annotations

import io
import sys
import warnings

import pytest

import fencepost


def test_runs_create_dash_calls_no_deprecated_click_api(db_url, monkeypatch, capsys):
    from fencepost.cli import main

    fencepost.open(db_url).close()  # runs create needs an existing store
    stdin = io.TextIOWrapper(io.BytesIO(b'{"run_id": "piped", "state": {"step": 1}}\n'), encoding="utf-8")
    monkeypatch.setattr(sys, "stdin", stdin)
    monkeypatch.delenv("FENCEPOST_DB", raising=False)
    with warnings.catch_warnings():
        # Only what fencepost's own code calls: a dependency's internal deprecations are not this test's.
        warnings.filterwarnings("error", category=DeprecationWarning, module=r"fencepost\.")
        with pytest.raises(SystemExit) as exited:
            main(["--db", db_url, "runs", "create", "-"])
    out, err = capsys.readouterr()
    assert exited.value.code in (0, None), (out, err)
    assert "created 1 run(s)" in out + err, (out, err)
    with fencepost.open(db_url, readonly=True) as store:
        assert store.runs.get("piped").state_json == '{"step":1}'
