"""What every command shares: the store opened once per invocation, errors, signals, rendering helpers.

Output formats (``--format``/``--json``) live in ``cli._output``.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import click
import msgspec
from rich.console import Console

console = Console()
err_console = Console(stderr=True)


class CliContext:
    """The group's state: the ``--db`` URL and the store, opened lazily on first use."""

    def __init__(self, url: str | None) -> None:
        self.url = url
        self._store: Any = None

    def store(self, *, readonly: bool) -> Any:
        """Open the store once: read-only for read commands (never creates or migrates)."""
        if self._store is None:
            import fencepost

            self._store = fencepost.open(self.url, readonly=readonly)
        return self._store

    @property
    def resolved_url(self) -> str:
        from fencepost._durable import resolve_url

        return resolve_url(self.url)

    def close(self) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None


def read_store() -> Any:
    """The store of the current invocation, opened read-only."""
    return click.get_current_context().find_object(CliContext).store(readonly=True)


def write_store(*, create: bool = True) -> Any:
    """The store of the current invocation, opened for writing.

    ``create=True`` creates and migrates the database if needed (``init``, ``demo``, ``worker``);
    ``create=False`` first proves, read-only, that it already exists, so a mistyped URL given to
    ``runs cancel`` or ``source rotate`` is an error instead of a new empty database.
    """
    obj = click.get_current_context().find_object(CliContext)
    if not create and obj._store is None:
        import fencepost

        fencepost.open(obj.url, readonly=True).close()
    return obj.store(readonly=False)


def error_text(exc: BaseException) -> str:
    """A ``FencepostError`` as the user sees it: its message, plus the driver's code when there is
    one (``[SQLITE_READONLY]``, ``[3D000]``), never a value."""
    code = getattr(exc, "db_code", None)
    text = str(exc)
    return f"{text} [{code}]" if isinstance(code, str) and code else text


def echo_error(message: str) -> None:
    """One line on stderr: the only way an error reaches the user."""
    line = " ".join(str(message).split())
    click.echo(f"Error: {line}", err=True)


def fail(message: str) -> click.ClickException:
    """A command's failure (exit 1): the boundary prints ``message`` as the one stderr line."""
    return click.ClickException(message)


INTERRUPTED = 130


@contextmanager
def stop_on_signals() -> Iterator[threading.Event]:
    """An event set by SIGTERM or the first Ctrl-C, for a loop that stops gracefully.

    SIGTERM is a normal stop (the command exits 0); Ctrl-C exits 130 once the loop has stopped. A
    second Ctrl-C interrupts at once. A process started with SIGINT ignored (a shell's background
    job) keeps ignoring it. Only the main thread may install the handlers.
    """
    stop = threading.Event()
    interrupted: list[bool] = []

    def on_interrupt(*_: object) -> None:
        interrupted.append(True)
        stop.set()
        signal.signal(signal.SIGINT, signal.default_int_handler)

    previous_term = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    previous_int = signal.getsignal(signal.SIGINT)
    if previous_int is not signal.SIG_IGN:
        signal.signal(signal.SIGINT, on_interrupt)
    try:
        yield stop
    except KeyboardInterrupt:
        interrupted.append(True)
    finally:
        signal.signal(signal.SIGTERM, previous_term)
        signal.signal(signal.SIGINT, previous_int)
    if interrupted:
        raise SystemExit(INTERRUPTED)


def table(title: str | None, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    """A table of preformatted rows (the demo's and the worker's reports), written like every other
    table: boxed on a wide enough terminal, plain aligned lines on a pipe (never folded)."""
    from fencepost.cli._output import Column, _write_table

    _write_table(title, [Column(c, c, wrap=False) for c in columns], [[fmt(v) for v in r] for r in rows])


def fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, msgspec.Struct):
        return msgspec.json.encode(value).decode()
    return str(value)


def when(ms: int | None) -> str:
    """A millisecond stamp as UTC ISO time (stamps from a manual or demo clock print as they are)."""
    if ms is None:
        return "-"
    try:
        return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
    except (OverflowError, OSError, ValueError):
        return str(ms)


def owner_text(owner: Any) -> str:
    if owner is None:
        return "-"
    return f"{owner.host_id}/{owner.pid}/{owner.nonce[:8]}"
