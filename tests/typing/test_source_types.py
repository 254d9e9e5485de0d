"""The package's own source type-checks: ``mypy src`` (its settings in pyproject.toml) reports nothing.

mypy read as bugs what the hints did not say (an ``Optional`` used unchecked, a helper's ``None``
return used as a value, a deprecated click helper typed ``object``); each error it reports is
a hint to fix or a defect to test and fix, so a new one fails here. The cache is a fresh temporary
directory, so the check is what a clean checkout gets (about 6 s on one core).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_mypy_reports_no_error_in_the_package_source(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"), "--cache-dir",
         str(tmp_path / "mypy-cache"), "src"],
        capture_output=True, text=True, cwd=ROOT, timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Success: no issues found" in result.stdout, result.stdout
