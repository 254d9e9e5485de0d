"""The type hints match the behaviour: what the docs show type-checks, and misuses stay refused.

mypy checks ``typed_usage.py`` (a builder with one source has ``catch_up().applied``, ``afollow`` has
``aclose()``, any object with ``is_set()`` is a stop signal ...) and every Python sample of the
README and docs/ against the package, as a user's type checker would. Third-party packages other
than msgspec (whose ``Struct`` bases the result types) are not followed, to keep this fast.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import fencepost
from tests._docs import python_blocks

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
USAGE = Path(__file__).with_name("typed_usage.py")
CONFIG = """\
[mypy]
python_version = 3.11
warn_unused_ignores = True
follow_imports = silent
[mypy-sqlalchemy.*,click.*,rich.*,opentelemetry.*,watchfiles.*,starlette.*,uvicorn.*,jinja2.*,psycopg.*]
follow_imports = skip
"""


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One mypy cache for this module's runs: the package is analysed once."""
    return tmp_path_factory.mktemp("mypy-cache")


def mypy(tmp_path: Path, cache: Path, *files: Path) -> subprocess.CompletedProcess[str]:
    """Run mypy over ``files`` against the ``fencepost`` this test imported (its source tree)."""
    config = tmp_path / "mypy.ini"
    config.write_text(CONFIG)
    env = {**os.environ, "MYPYPATH": str(Path(fencepost.__file__).resolve().parents[1])}
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(config), "--cache-dir", str(cache),
         "--scripts-are-modules", "--no-error-summary", *map(str, files)],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120,
    )


def samples(tmp_path: Path) -> list[Path]:
    """Each Python block of the README and docs/ as a file of its own, named after its page."""
    out = []
    for page in PAGES:
        for i, block in enumerate(python_blocks(page)):
            name = re.sub(r"\W", "_", str(page.relative_to(ROOT).with_suffix(""))) + f"_{i}.py"
            (tmp_path / name).write_text(block, encoding="utf-8")
            out.append(tmp_path / name)
    return out


def test_the_public_api_and_every_doc_sample_type_check(tmp_path, cache):
    files = samples(tmp_path)
    assert len(files) >= 20
    result = mypy(tmp_path, cache, USAGE, *files)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_check_catches_a_wrong_type(tmp_path, cache):
    """Guard: the check is not vacuous (mypy runs, follows fencepost and reports)."""
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import fencepost\n"
        "from fencepost.projections import ProjectionBuilder, RunsByStatus\n\n\n"
        "def f(store: fencepost.Store) -> int:\n"
        "    return ProjectionBuilder({'a': store}, 'sqlite://', RunsByStatus()).catch_up().applied\n"
    )
    result = mypy(tmp_path, cache, bad)
    assert result.returncode == 1, result.stdout + result.stderr
    assert '"dict[str, CatchUp]" has no attribute "applied"' in result.stdout
