"""Without ``$FENCEPOST_TEST_POSTGRES_URL`` the suite asks testcontainers for a PostgreSQL server.

Defect: it imported ``testcontainers.postgres``, which testcontainers 4.x deprecates in favour of
``testcontainers.community.postgres``, so a first ``pytest`` run from the README printed a
``DeprecationWarning`` from our own conftest. No backend: this is the suite's own set-up (Docker is
pointed at a socket that does not exist, so no container is ever started).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_asking_testcontainers_for_postgres_raises_no_deprecation_warning(tmp_path) -> None:
    pytest.importorskip("testcontainers")
    env = {k: v for k, v in os.environ.items() if k != "FENCEPOST_TEST_POSTGRES_URL"}
    env["DOCKER_HOST"] = f"unix://{tmp_path / 'no-docker.sock'}"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    code = ("import tests.conftest as c\n"
            "assert c._postgres_base_url() is None\n"
            "print(c._pg_state['why'])\n")
    done = subprocess.run([sys.executable, "-W", "error::DeprecationWarning", "-c", code], capture_output=True,
                          text=True, env=env, cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "testcontainers failed" in done.stdout and "DeprecationWarning" not in done.stdout, done.stdout
