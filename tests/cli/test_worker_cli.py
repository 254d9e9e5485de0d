"""``fencepost worker`` runs the user's code safely, through the real console script."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

import fencepost
from tests.cli.conftest import assert_one_line_error, fencepost_exe, worker_holding_runs

SECRET = "s3cr3t-hunter2-value"


def _like_a_terminal() -> None:
    # A shell starts background jobs with SIGINT ignored, and Python then installs no Ctrl-C handler;
    # start the command the way a terminal does, with SIGINT at its default.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _create(db_url: str, ids: list[str]) -> None:
    with fencepost.open(db_url) as store:
        for run_id in ids:
            store.runs.create(run_id, "{}")


def _statuses(db_url: str, ids: list[str]) -> dict[str, str]:
    with fencepost.open(db_url, readonly=True) as store:
        return {run_id: store.runs.get(run_id).status for run_id in ids}


def test_worker_without_task_is_a_usage_error_and_changes_nothing(run_cli, db_url):
    _create(db_url, ["a", "b"])
    result = run_cli("--db", db_url, "worker", "--until-idle")
    assert_one_line_error(result)
    assert result.code == 2 and "--task" in result.err
    assert _statuses(db_url, ["a", "b"]) == {"a": "pending", "b": "pending"}


def test_worker_imports_the_task_from_the_current_folder(run_cli, db_url, tmp_path):
    (tmp_path / "mytasks.py").write_text("def work(ctx):\n    return {'by': 'mytasks'}\n")
    _create(db_url, ["c1", "c2", "c3"])
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = run_cli("--db", db_url, "worker", "-n", "1", "--task", "mytasks:work", "--until-idle",
                     cwd=tmp_path, env=env, timeout=90)
    assert result.code == 0, result
    assert set(_statuses(db_url, ["c1", "c2", "c3"]).values()) == {"completed"}


def test_the_worker_report_on_a_narrow_pipe_is_one_line_per_process(run_cli, db_url, tmp_path):
    """Written to a pipe, the report is plain aligned lines: no header folded, nothing cropped."""
    (tmp_path / "mytasks.py").write_text("def work(ctx):\n    return {}\n")
    _create(db_url, ["n1"])
    result = run_cli("--db", db_url, "worker", "-n", "2", "--task", "mytasks:work", "--until-idle",
                     cwd=tmp_path, env={"COLUMNS": "60"}, timeout=90)
    assert result.code == 0, result
    lines = [line.split() for line in result.out.splitlines() if line.strip()]
    header = ["pid", "claimed", "takeovers", "completed", "failed", "cancelled", "suspended", "lost", "state"]
    assert header in lines, result.out
    body = lines[lines.index(header) + 1:]
    assert len(body) == 2 and all(len(row) == len(header) for row in body), result.out
    assert sum(int(row[3]) for row in body) == 1


def test_an_import_error_inside_the_task_module_is_shown_as_is(run_cli, tmp_path):
    (tmp_path / "brokentasks.py").write_text("import not_a_real_dependency_xyz\n\ndef work(ctx):\n    pass\n")
    result = run_cli("worker", "--task", "brokentasks:work", cwd=tmp_path)
    assert_one_line_error(result)
    assert result.code == 2
    assert "No module named 'not_a_real_dependency_xyz'" in result.err


def test_a_missing_function_names_the_module_and_the_attribute(run_cli, tmp_path):
    (tmp_path / "fewtasks.py").write_text("def other(ctx):\n    pass\n")
    result = run_cli("worker", "--task", "fewtasks:work", cwd=tmp_path)
    assert_one_line_error(result)
    assert result.code == 2 and "fewtasks" in result.err and "work" in result.err


def test_an_async_def_task_is_a_usage_error_and_changes_nothing(run_cli, db_url, tmp_path):
    """An ``async def`` task passed the import check, then each worker process died with a
    traceback (or, before that, every run it took was failed): the worker calls the function
    synchronously. It is refused up front, like a task that is not callable."""
    (tmp_path / "asynctasks.py").write_text("async def work(ctx):\n    return {}\n")
    _create(db_url, ["a1"])
    result = run_cli("--db", db_url, "worker", "-n", "1", "--task", "asynctasks:work", "--until-idle",
                     cwd=tmp_path, timeout=90)
    assert_one_line_error(result)
    assert result.code == 2 and "--task" in result.err and "async def" in result.err
    assert _statuses(db_url, ["a1"]) == {"a1": "pending"}


def test_a_task_that_takes_no_argument_is_a_usage_error_and_changes_nothing(run_cli, db_url, tmp_path):
    """``def work():`` was accepted, then every run the worker took was settled failed with
    ``TypeError: work() takes 0 positional arguments but 1 was given``. It is refused up front."""
    (tmp_path / "noargtasks.py").write_text("def work():\n    return {}\n")
    _create(db_url, ["n1", "n2"])
    result = run_cli("--db", db_url, "worker", "-n", "1", "--task", "noargtasks:work", "--until-idle",
                     cwd=tmp_path, timeout=90)
    assert_one_line_error(result)
    assert result.code == 2 and "--task" in result.err and "one positional argument" in result.err, result
    assert _statuses(db_url, ["n1", "n2"]) == {"n1": "pending", "n2": "pending"}


def test_why_a_run_failed_is_shown_by_runs_show_and_its_json(run_cli, db_url, tmp_path):
    (tmp_path / "failtasks.py").write_text(
        "def parse(text):\n"
        f"    raise ValueError('cannot parse the row; token={SECRET}')\n"
        "def work(ctx):\n"
        "    parse('row')\n"
    )
    _create(db_url, ["f1"])
    result = run_cli("--db", db_url, "worker", "-n", "1", "--task", "failtasks:work", "--until-idle",
                     cwd=tmp_path, timeout=90)
    assert result.code == 0, result
    shown = run_cli("--db", db_url, "runs", "show", "f1")
    assert shown.code == 0, shown
    assert "ValueError" in shown.out and "cannot parse the row" in shown.out
    assert SECRET not in shown.out
    doc = json.loads(run_cli("--db", db_url, "runs", "show", "f1", "--json").out)
    failure = doc["run"]["failure"]
    assert failure["type"] == "ValueError"
    assert failure["message"].startswith("cannot parse the row; token=")
    assert SECRET not in json.dumps(doc)
    assert "in parse" in failure["traceback"]


@pytest.mark.slow
def test_ctrl_c_stops_the_worker_gracefully_with_exit_130(db_url, tmp_path):
    with worker_holding_runs(db_url, tmp_path, ["k0", "k1"], "-n", "1", preexec_fn=_like_a_terminal) as proc:
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole group
        _out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    # Graceful: the runs in hand were parked, not left running on a dead lease.
    assert set(_statuses(db_url, ["k0", "k1"]).values()) == {"suspended"}


def _children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def _sigterm_once(db_url: str, tmp_path, env: dict[str, str], started, within_s: float,
                  poll_s: float) -> tuple[subprocess.Popen, str, str]:
    """``fencepost worker -n 2 --task quicktasks:work`` sent one SIGTERM once ``started(proc)`` holds
    (failing if it exits first or ``within_s`` passes): the process, its stdout and its stderr."""
    proc = subprocess.Popen([fencepost_exe(), "--db", db_url, "worker", "-n", "2", "--task", "quicktasks:work"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + within_s
        while not started(proc):
            assert proc.poll() is None and time.monotonic() < deadline, "the worker processes never started"
            time.sleep(poll_s)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc, out, err


@pytest.mark.slow
def test_sigterm_while_the_worker_processes_are_still_starting_exits_0(db_url, tmp_path):
    """A SIGTERM (``systemctl stop``, a deploy) that came while the worker processes were still
    starting, before they could stop gracefully, killed them with SIGTERM as asked; the command then
    called them abnormal and exited 1, though nothing was claimed and the stop was the one asked for."""
    (tmp_path / "quicktasks.py").write_text("def work(ctx):\n    return {}\n")
    _create(db_url, ["s0"])
    env = {k: v for k, v in os.environ.items() if k != "FENCEPOST_DB"}
    # The first child process exists: it is still starting (the interpreter, its imports).
    proc, out, err = _sigterm_once(db_url, tmp_path, env, lambda proc: len(_children(proc.pid)) >= 2, 30, 0.005)
    assert proc.returncode == 0, (out, err)
    assert "abnormally" not in out + err and "Traceback" not in err
    assert _statuses(db_url, ["s0"])["s0"] in ("pending", "completed", "suspended")


@pytest.mark.slow
def test_sigterm_while_the_worker_processes_are_still_starting_lists_every_process(db_url, tmp_path):
    """A SIGTERM that reached ``fencepost worker`` while its processes were still starting ended them
    before they could report: the summary listed none of them (an empty table), so the operator
    could not tell what was started or whether work was lost. Every started process now has a row:
    state ``stopped-before-start`` and zero counts (it had taken no run). The children are held
    in interpreter start-up (a ``sitecustomize`` that sleeps only in a spawned child) so the signal
    surely comes first; the database only has to exist, so one backend would do, but both run."""
    (tmp_path / "quicktasks.py").write_text("def work(ctx):\n    return {}\n")
    hold = tmp_path / "hold"
    hold.mkdir()
    (hold / "sitecustomize.py").write_text(
        "import os, sys, time\n"
        "if '--multiprocessing-fork' in sys.argv:\n"
        f"    open(os.path.join({str(tmp_path)!r}, 'child-%d' % os.getpid()), 'w').close()\n"
        "    time.sleep(20)\n")
    _create(db_url, ["s0"])
    env = {k: v for k, v in os.environ.items() if k != "FENCEPOST_DB"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(hold), env.get("PYTHONPATH")) if p)
    env["COLUMNS"] = "200"
    # Both children started, neither past start-up.
    proc, out, err = _sigterm_once(db_url, tmp_path, env, lambda _: len(list(tmp_path.glob("child-*"))) >= 2, 60, 0.01)
    assert proc.returncode == 0, (out, err)
    children = sorted(int(p.name.split("-")[1]) for p in tmp_path.glob("child-*"))
    lines = [line.split() for line in out.splitlines() if line.strip()]
    header = ["pid", "claimed", "takeovers", "completed", "failed", "cancelled", "suspended", "lost", "state"]
    assert header in lines, out
    body = lines[lines.index(header) + 1:]
    assert sorted(int(row[0]) for row in body) == children, out
    assert all(row[1:] == ["0"] * 7 + ["stopped-before-start"] for row in body), out
    assert _statuses(db_url, ["s0"]) == {"s0": "pending"}


def test_a_task_module_failing_at_import_shows_its_message_redacted(run_cli, tmp_path):
    """A module raising at import with a credential in its message: the usage error keeps the module
    name and the exception type, and shows the message as a run failure is logged (redacted, escaped).
    No store is opened (the reference is refused first), so there is no backend to vary."""
    (tmp_path / "leakytasks.py").write_text(
        "raise RuntimeError('password=hunter2XYZ\\x1b[2J')\n\ndef work(ctx):\n    pass\n")
    result = run_cli("worker", "--task", "leakytasks:work", cwd=tmp_path)
    assert_one_line_error(result)
    assert result.code == 2
    assert "hunter2XYZ" not in result.err and "hunter2XYZ" not in result.out
    assert "\x1b" not in result.err
    assert "'leakytasks'" in result.err and "RuntimeError" in result.err
    assert "password=[REDACTED]" in result.err


def test_a_task_module_exiting_at_import_is_a_usage_error(run_cli, tmp_path):
    """A module that calls ``sys.exit(3)`` while it is imported (a script's ``if`` guard left out)
    ended ``fencepost worker`` with exit code 3 and not a word: an exit code the command line never
    documents. It is a module that fails to import: a usage error (exit 2) naming the module and the
    exit. Refused before any store is opened, so there is no backend to vary."""
    (tmp_path / "scripttasks.py").write_text("import sys\n\ndef work(ctx):\n    pass\n\nsys.exit(3)\n")
    result = run_cli("worker", "--task", "scripttasks:work", cwd=tmp_path)
    assert_one_line_error(result)
    assert result.code == 2, result
    assert "'scripttasks'" in result.err and "SystemExit" in result.err and "--task" in result.err


@pytest.mark.parametrize("ref", ["mytasks.py:work", "./mytasks:work", "./mytasks.py:work", "sub/mytasks.py:work"])
def test_a_file_path_for_the_task_module_says_to_give_a_module_name(run_cli, tmp_path, ref):
    """``--task mytasks.py:work`` or ``--task ./mytasks:work`` (a file path, as a new user types it)
    was refused with the import machinery's own text ("No module named 'mytasks.py'; 'mytasks' is not
    a package", or a TypeError about relative imports and a 'package' argument). The usage error now
    says a module name is wanted, and which. Refused before any store is opened: no backend to vary."""
    (tmp_path / "mytasks.py").write_text("def work(ctx):\n    return {}\n")
    result = run_cli("worker", "--task", ref, cwd=tmp_path)
    assert_one_line_error(result)
    assert result.code == 2, result
    assert "module name" in result.err and "TypeError" not in result.err, result.err
    assert "--task mytasks:work" in result.err, result.err


def test_a_task_submodule_named_py_failing_at_import_shows_its_own_error(run_cli, tmp_path):
    """``--task pkg.py:work`` where ``py`` is a real submodule of the package ``pkg`` (no file
    ``pkg.py`` anywhere) and it fails to import: the usage error said "give a module name, not a file
    path", hiding the import error the user must fix. That hint is for a path only (a slash, or a
    ``.py`` file of that name in the folder the task is imported from); here the import's own error
    is shown. Refused before any store is opened: no backend to vary."""
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "py.py").write_text("import not_a_real_dependency_xyz\n\ndef work(ctx):\n    pass\n")
    result = run_cli("worker", "--task", "pkg.py:work", cwd=tmp_path)
    assert_one_line_error(result)
    assert result.code == 2, result
    assert "No module named 'not_a_real_dependency_xyz'" in result.err, result.err
    assert "module name, not a file path" not in result.err, result.err


def test_a_task_module_ending_in_py_with_no_such_file_shows_the_import_error(run_cli, tmp_path):
    """``--task nothere.py:work`` with neither a file ``nothere.py`` nor a module ``nothere``: no
    file path was given, so no hint to give a module name; the import's own error says what is
    missing. Refused before any store is opened: no backend to vary."""
    result = run_cli("worker", "--task", "nothere.py:work", cwd=tmp_path)
    assert_one_line_error(result)
    assert result.code == 2, result
    assert "module name, not a file path" not in result.err, result.err
    assert "No module named 'nothere" in result.err, result.err


def test_waiting_for_the_database_at_start_up_needs_nothing_of_the_console() -> None:
    """The worker's start-up wait shares the console's rule for which open failures to wait out
    (``fencepost.errors.waiting_may_cure``) without importing the console package: the worker CLI
    does not depend on ``fencepost.ui``. No database is involved (the attempt is a stand-in), so
    there is no backend to vary."""
    script = (
        "import sys, threading\n"
        "from fencepost.cli.worker import until_it_answers\n"
        "from fencepost.errors import OpenError\n"
        "tries = []\n"
        "def attempt():\n"
        "    tries.append(1)\n"
        "    if len(tries) == 1:\n"
        "        err = OpenError('cannot_connect', 'open', 'no answer yet')\n"
        "        err.transient = True\n"
        "        raise err\n"
        "assert until_it_answers(attempt, threading.Event()) is True\n"
        "assert len(tries) == 2, tries\n"
        "print(sorted(m for m in sys.modules if m.startswith('fencepost.ui')))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", done.stdout


def test_a_process_whose_end_is_not_known_has_the_state_unknown():
    """The summary's state of a process that ended without reporting was its signal or
    ``exit-code-N``, N being its exit code, which is None for a process not seen to end: a Ctrl-C
    that cuts short the command's last wait for its processes (the one after it killed them)
    leaves such a process, and its row said ``exit-code-None``. It now says ``unknown`` (counts
    ``-``), as the help describes. A process still running stands for it here: the same
    ``exitcode`` of None, no timing to win. No store is involved, so there is no backend to vary."""
    import multiprocessing
    import time

    from fencepost.cli.worker import COUNTS, _summary

    ctx = multiprocessing.get_context("spawn")
    p = ctx.Process(target=time.sleep, args=(60,), name="fencepost-test-sleeper")
    p.start()
    try:
        assert p.exitcode is None
        assert _summary([p], ctx.Queue(), stopped=True) == [(p.pid, *(None for _ in COUNTS[1:]), "unknown")]
    finally:
        p.kill()
        p.join()


@pytest.mark.slow
def test_sigterm_with_stderr_a_closed_pipe_still_stops_every_process(db_url, tmp_path):
    """``fencepost worker`` whose stderr is a pipe nobody reads any more (a log shipper that went
    away) gets a SIGTERM: its "stopping" line cannot be written. The failed write ended the command
    inside its signal handler (rich's console exits 1 on a broken pipe, and points stdout at the null
    device first), before any process was told to stop: the command then hung at exit waiting for
    processes that went on working, and no summary was printed. The stop must go through all the
    same: each process stops as asked, the summary reaches stdout, and the exit code is 0."""
    (tmp_path / "quicktasks.py").write_text("def work(ctx):\n    return {}\n")
    _create(db_url, ["s0"])
    env = {k: v for k, v in os.environ.items() if k != "FENCEPOST_DB"}
    env["COLUMNS"] = "200"
    read_end, write_end = os.pipe()
    os.close(read_end)  # nobody reads stderr: every write to it fails (EPIPE)
    try:
        proc = subprocess.Popen([fencepost_exe(), "--db", db_url, "worker", "-n", "2", "--task", "quicktasks:work"],
                                stdout=subprocess.PIPE, stderr=write_end, text=True, env=env, cwd=tmp_path,
                                start_new_session=True)
    finally:
        os.close(write_end)
    try:
        deadline = time.monotonic() + 60
        # Both processes past start-up (each has its own database connection threads by now).
        while len(_children(proc.pid)) < 2 or _statuses(db_url, ["s0"])["s0"] != "completed":
            assert proc.poll() is None and time.monotonic() < deadline, "the worker processes never worked"
            time.sleep(0.05)
        children = _children(proc.pid)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    lines = [line.split() for line in out.splitlines() if line.strip()]
    header = ["pid", "claimed", "takeovers", "completed", "failed", "cancelled", "suspended", "lost", "state"]
    assert header in lines, out
    body = lines[lines.index(header) + 1:]
    # Both worker processes (the command's other child is multiprocessing's resource tracker).
    assert len(body) == 2 and all(int(row[0]) in children for row in body), (out, children)
    # Each stopped as asked: after working, or (the other took the one run first) while starting.
    assert all(row[-1] in ("worked", "stopped-before-start") for row in body), out
    assert any(row[-1] == "worked" for row in body), out
    assert proc.returncode == 0, out
