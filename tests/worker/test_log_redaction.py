"""The worker's logs carry a failing run's traceback (file, line, function) with every message in it,
chained causes included, redacted as the stored failure is: a secret never reaches a log handler.

Handlers get preformatted text, never the exception (``exc_info``): a handler that formats the
exception itself, or keeps frame locals, would print every message verbatim."""

from __future__ import annotations

import logging
import os
import subprocess
import threading
import time

import fencepost
from fencepost.journal.redaction import FunctionRule, Redaction
from fencepost.worker import RunContext, Worker
from tests.cli.conftest import fencepost_exe

PASSWORD = "hunter2secret"
URL_PASSWORD = "pw1234zz"
CAUSE_SECRET = "ctx-s3cr3t-value"
SECRETS = (PASSWORD, URL_PASSWORD, CAUSE_SECRET)


def _open_billing_connection() -> None:
    raise ConnectionError(f"refused; password={CAUSE_SECRET}")


def _charge_customer(ctx: RunContext) -> None:
    try:
        _open_billing_connection()
    except ConnectionError as cause:
        raise ValueError(f"bad config password={PASSWORD} url=postgresql://u:{URL_PASSWORD}@h/db") from cause


def _run_until_logged(worker: Worker, caplog, needle: str) -> None:
    """Run ``worker`` until a record containing ``needle`` is logged, then stop it.

    A run whose settlement failed stays ``running``, so ``until_idle`` would wait for its lease.
    """
    stop = threading.Event()
    thread = threading.Thread(target=worker.run, args=(stop,))
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not any(needle in r.getMessage() for r in caplog.records):
            assert time.monotonic() < deadline, f"the worker never logged {needle!r}"
            time.sleep(0.01)
    finally:
        stop.set()
        thread.join(timeout=30)


def _worker_records(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "fencepost.worker"]


def _assert_no_secret_reaches_a_handler(records: list[logging.LogRecord]) -> str:
    """Every record formatted as a plain handler would, and its raw fields, free of the secrets."""
    formatter = logging.Formatter("%(levelname)s %(message)s")
    text = "\n".join(formatter.format(r) for r in records)
    for secret in SECRETS:
        assert secret not in text
        for r in records:
            assert secret not in repr(r.args) and secret not in str(r.msg)
    # No handler is given the exception itself: one that formats it (or walks its frames) would leak.
    assert all(r.exc_info is None for r in records)
    return text


def test_a_failed_run_is_logged_with_its_traceback_and_no_secret(store, caplog):
    store.runs.create("leaky", "{}")
    with caplog.at_level(logging.INFO, logger="fencepost.worker"):
        stats = Worker(store, _charge_customer).run(until_idle=True)
    assert stats.failed == 1
    records = _worker_records(caplog)
    text = _assert_no_secret_reaches_a_handler(records)
    failed = [r for r in records if "settled failed" in r.getMessage()]
    assert len(failed) == 1 and failed[0].levelno == logging.WARNING and failed[0].run_id == "leaky"
    logged = failed[0].getMessage()
    # The traceback is there: the frames (file and function) and both exception types.
    assert "Traceback (most recent call last)" in logged
    assert "_charge_customer" in logged and "_open_billing_connection" in logged
    assert os.path.basename(__file__) in logged
    assert "ValueError: bad config password=[REDACTED]" in logged
    assert "ConnectionError: refused; password=[REDACTED]" in logged
    assert "The above exception was the direct cause" in logged
    assert "[REDACTED]" in text
    # It is the text the store recorded: what the log shows is what runs show prints.
    assert store.runs.get("leaky").failure.traceback in logged


def test_a_settlement_that_fails_is_logged_with_the_run_s_secrets_redacted(store, caplog, monkeypatch):
    """The error raised while settling chains the task's exception (``__context__``): both redacted."""
    store.runs.create("unsettled", "{}")
    original = store.runs.transition_owned

    def refusing(run_id, owner, to, *args, **kwargs):
        if to == "failed":
            raise RuntimeError(f"settle refused; dsn=postgresql://app:{URL_PASSWORD}@db/prod")
        return original(run_id, owner, to, *args, **kwargs)

    monkeypatch.setattr(store.runs, "transition_owned", refusing)
    with caplog.at_level(logging.INFO, logger="fencepost.worker"):
        _run_until_logged(Worker(store, _charge_customer), caplog, "settling it failed")
    records = _worker_records(caplog)
    _assert_no_secret_reaches_a_handler(records)
    broke = [r for r in records if "settling it failed" in r.getMessage()]
    assert len(broke) == 1 and broke[0].levelno == logging.ERROR and broke[0].run_id == "unsettled"
    logged = broke[0].getMessage()
    assert "RuntimeError: settle refused; dsn=postgresql://app:[REDACTED]@db/prod" in logged
    assert "in refusing" in logged and "_charge_customer" in logged and "ValueError" in logged
    assert "During handling of the above exception, another exception occurred" in logged


def test_a_redaction_that_fails_still_lets_no_secret_into_the_log(store, caplog):
    """The store refuses to settle (its redaction failed); the log falls back to the default rules."""

    def broken(text: str) -> str:
        raise RuntimeError(f"rule crashed on {text}")

    store.runs.create("broken", "{}")
    store.journal.redaction = Redaction(rules=[FunctionRule("broken", broken)])
    with caplog.at_level(logging.INFO, logger="fencepost.worker"):
        _run_until_logged(Worker(store, _charge_customer), caplog, "settling it failed")
    records = _worker_records(caplog)
    _assert_no_secret_reaches_a_handler(records)
    broke = [r for r in records if "settling it failed" in r.getMessage()]
    assert len(broke) == 1
    logged = broke[0].getMessage()
    assert "could not be redacted" in logged and "_charge_customer" in logged
    assert "ValueError: bad config password=[REDACTED]" in logged
    assert store.runs.get("broken").status == "running"  # nothing settled, nothing stored


TASKS = f'''
def _open_billing_connection():
    raise ConnectionError("refused; password={CAUSE_SECRET}")


def charge_customer(ctx):
    try:
        _open_billing_connection()
    except ConnectionError as cause:
        raise ValueError("bad config password={PASSWORD} url=postgresql://u:{URL_PASSWORD}@h/db") from cause
'''


def test_the_worker_command_logs_the_traceback_to_stderr_without_secrets(db_url, tmp_path):
    (tmp_path / "leakytasks.py").write_text(TASKS)
    with fencepost.open(db_url) as s:
        s.runs.create("cli-leaky", "{}")
    env = {k: v for k, v in os.environ.items() if k not in ("FENCEPOST_DB", "PYTHONPATH")}
    proc = subprocess.run([fencepost_exe(), "--db", db_url, "worker", "-n", "1", "--task", "leakytasks:charge_customer",
                           "--until-idle"], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for secret in SECRETS:
        assert secret not in proc.stderr and secret not in proc.stdout
    assert "run cli-leaky settled failed" in proc.stderr
    assert "Traceback (most recent call last)" in proc.stderr
    assert "leakytasks.py" in proc.stderr
    assert "in charge_customer" in proc.stderr and "in _open_billing_connection" in proc.stderr
    assert "ValueError: bad config password=[REDACTED] url=postgresql://u:[REDACTED]@h/db" in proc.stderr
    assert "ConnectionError: refused; password=[REDACTED]" in proc.stderr
    with fencepost.open(db_url, readonly=True) as s:
        assert s.runs.get("cli-leaky").status == "failed"
