"""Ctrl-C while the ``fencepost`` command is still importing the package (a second or more on a
loaded machine) exits 130 without a ``KeyboardInterrupt`` traceback.

The console script is run as pip writes it, from the entry point ``pyproject.toml`` declares (the
one installed in a development environment may predate a change to it). The interpreter's own
start-up (``site``, before any of fencepost's code runs) is outside fencepost's reach, so each
SIGINT is sent once ``-X importtime`` shows the package being imported: at several depths of it.
The child's stderr is a pipe of one page, so the child cannot run ahead of the test reading it
(with the default 64 KiB it could write all of the import's ~35 KiB of lines, finish and print
the help before a reader slowed by a loaded machine got to the line it waits for).
No backend is involved: nothing here opens a database.
"""

from __future__ import annotations

import fcntl
import os
import re
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# An ``-X importtime`` line of a module imported by fencepost's code (the entry module, the
# package, its dependencies), never by the interpreter's start-up.
OURS = re.compile(r"^import time:.*\| +(_fencepost_console|fencepost|sqlalchemy|msgspec|click|rich)\b")

# What pip writes for a console script ``name = "module:function"``.
WRAPPER = """\
import re
import sys
from {module} import {function}
if __name__ == '__main__':
    sys.argv[0] = re.sub(r'(-script\\.pyw|\\.exe)?$', '', sys.argv[0])
    sys.exit({function}())
"""


def console_script(tmp_path: Path) -> Path:
    module, _, function = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]["fencepost"] \
        .partition(":")
    script = tmp_path / "fencepost"
    script.write_text(WRAPPER.format(module=module, function=function))
    return script


def _one_page_pipe() -> tuple[int, int]:
    """A pipe that holds one page: a writer blocks once it is that far ahead of its reader."""
    read_end, write_end = os.pipe()
    fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, 4096)
    return read_end, write_end


@pytest.mark.parametrize(("imported", "reader_delay_s"), [(1, 0), (40, 0), (150, 0), (300, 0), (300, 2)])
def test_ctrl_c_while_importing_exits_130_without_a_traceback(tmp_path, imported, reader_delay_s):
    """SIGINT after ``imported`` modules of fencepost's own import finished (the first, the
    SQLAlchemy ones, ...): the process ends 130, prints no traceback and never gets to the help.
    ``reader_delay_s``: the test starts reading late, as on a loaded machine (with the default pipe
    size the child had finished by then: exit 0 with the help)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    env.pop("PYTHONWARNINGS", None)
    read_end, write_end = _one_page_pipe()
    proc = subprocess.Popen([sys.executable, "-X", "importtime", str(console_script(tmp_path)), "runs", "--help"],
                            stdout=subprocess.PIPE, stderr=write_end, text=True, env=env, cwd=tmp_path)
    os.close(write_end)
    stderr = os.fdopen(read_end, encoding="utf-8", errors="replace")
    time.sleep(reader_delay_s)
    seen: list[str] = []
    counting = False
    sent = False
    try:
        for line in stderr:
            seen.append(line)
            # Nested imports are reported before their parent: the first line after the entry
            # module's own is already part of the package import.
            if counting and (imported := imported - 1) <= 0 and not sent:
                proc.send_signal(signal.SIGINT)
                sent = True
                break
            if OURS.search(line):
                counting = True
        rest = stderr.read()
        out, _ = proc.communicate(timeout=60)
    finally:
        stderr.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    err = "".join(seen) + rest
    assert sent, "the package import was never seen"
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
    assert proc.returncode == 130, (proc.returncode, err[-3000:])
    assert "Usage:" not in out
