"""Run the real ``fencepost`` executable in a subprocess, as a user would."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest


def fencepost_exe() -> str:
    """The console script installed beside this interpreter (else the one on PATH)."""
    here = Path(sys.executable).parent / "fencepost"
    if here.exists():
        return str(here)
    found = shutil.which("fencepost")
    if found is None:
        pytest.fail("the fencepost console script is not installed (pip install -e .)")
    return found


class Result:
    def __init__(self, proc: subprocess.CompletedProcess) -> None:
        self.code = proc.returncode
        self.out = proc.stdout
        self.err = proc.stderr

    def __repr__(self) -> str:
        return f"Result(code={self.code}, out={self.out[-2000:]!r}, err={self.err[-2000:]!r})"


@pytest.fixture
def run_cli(tmp_path):
    """``run_cli(*args, cwd=None, env=None, timeout=60) -> Result`` with FENCEPOST_DB unset."""

    def run(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None, timeout: float = 60) -> Result:
        full_env = {k: v for k, v in os.environ.items() if k != "FENCEPOST_DB"}
        full_env["COLUMNS"] = "200"
        full_env.update(env or {})
        proc = subprocess.run([fencepost_exe(), *args], capture_output=True, text=True, cwd=cwd or tmp_path,
                              env=full_env, timeout=timeout)
        return Result(proc)

    return run


def assert_one_line_error(result: Result) -> None:
    """Non-zero exit, exactly one line on stderr, never a traceback."""
    assert result.code != 0, result
    lines = [line for line in result.err.splitlines() if line.strip()]
    assert len(lines) == 1, result
    assert "Traceback" not in result.err and "Traceback" not in result.out, result
