"""What every command shares: the store opened once per invocation, errors, signals, rendering helpers.

Output formats (``--format``/``--json``) live in ``cli._output``.
"""

from __future__ import annotations

import math
import os
import re
import select
import shlex
import signal
import stat
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, NamedTuple

import click
import msgspec
from rich.console import Console

from fencepost._values import identifier_problem, parse_json_text, text_problem
from fencepost.journal import COMPANION_PREFIX


def null_stream(stream: Any) -> None:
    """Point the file descriptor under ``stream`` at the null device: what the stream still holds,
    and every later write, then goes nowhere instead of failing. For a stream nobody reads any more
    (a closed pipe), whose failed flush at exit would otherwise end the process with status 1."""
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)


class _StderrConsole(Console):
    """The console on stderr. When nobody reads stderr any more (a closed pipe), what is left to say
    there is dropped and the command goes on: its output on stdout, its exit status and the work it
    is doing (a worker stopping its processes) are not stderr's to end. rich's own default points
    stdout at the null device and exits 1, which lost the output a command had still to print."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        null_stream(self.file)


console = Console()
err_console = _StderrConsole(stderr=True)


_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
NAME_RULE = "1..64 characters of A-Z a-z 0-9 . _ -, starting with a letter or digit"


class FiniteRange(click.FloatRange):
    """click's ``FloatRange`` that also refuses ``nan`` and ``inf``: nan compares false with every
    bound, so it passed the range check (``--interval nan`` printed status lines without a pause)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail("must be a finite number", param, ctx)
        return number


MAX_SAFE_INTEGER = 2**53 - 1
"""The largest integer the store takes (positions, revisions, seq, epoch milliseconds)."""


class RunIdType(click.ParamType):
    """A run id as typed: one no run can have (empty, over 1024 UTF-16 units, bytes that are not
    UTF-8) is a usage error here, not the store's refusal, which would be a failure (exit 1).

    ``new=True`` (the id of a run to create): an id in the journal's reserved companion-stream
    namespace is refused too. Elsewhere such an id is taken (``journal show`` reads a companion
    stream by it; other commands find no run with it)."""

    name = "RUN_ID"

    def __init__(self, *, new: bool = False) -> None:
        self.new = new

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        problem = identifier_problem(value) if isinstance(value, str) else None
        if problem:
            if "surrogate" in problem:
                problem = "must be UTF-8 text (it holds bytes that are not)"
            self.fail(f"a run id {problem}", param, ctx)
        if self.new and isinstance(value, str) and value.startswith(COMPANION_PREFIX):
            self.fail(f"a run id must not use the reserved companion-stream prefix {COMPANION_PREFIX} "
                      "(the journal's own streams)", param, ctx)
        return value


class NonEmpty(click.ParamType):
    """A string option that must not be empty (``--flow ""`` matches nothing the store can hold)."""

    name = "TEXT"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if value == "":
            self.fail("must not be empty", param, ctx)
        if isinstance(value, str) and not_utf8(value):
            self.fail("must be UTF-8 text (it holds bytes that are not)", param, ctx)
        return value


def not_utf8(text: str) -> bool:
    """True when command-line text held bytes that are not UTF-8: Python hands them to the program
    as lone surrogates, which every encoder refuses with an error quoting the character."""
    return not text.isascii() and text_problem(text) is not None


class JsonText(click.ParamType):
    """JSON text the store can hold, stored byte for byte (``--state``): parsed under the store's
    durable-value rules, so a value it would refuse (nested past the depth limit, say) is a usage
    error naming the rule, and nesting too deep for the decoder is that rule too, not a
    ``RecursionError``."""

    name = "JSON"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and not_utf8(value):
            self.fail("must be UTF-8 text (it holds bytes that are not)", param, ctx)
        _, problem = parse_json_text(value)
        if problem == "is not valid JSON" or (problem and not isinstance(value, str)):
            self.fail(f"must be JSON text ({len(str(value))} characters given do not parse)", param, ctx)
        if problem:
            self.fail(f"must be a value the store can hold ({problem})", param, ctx)
        return value


class DbSpec(NamedTuple):
    """One ``--db`` value: an optional store name and its URL (``None``: ``$FENCEPOST_DB`` or the default)."""

    name: str | None
    url: str | None
    where: str = ""  # how errors name it: "--db #2", "--shards line 3" ("" for the one store)


def _label(specs: Sequence[DbSpec], i: int) -> str:
    """How an error names the ``i``-th store: where it was given (``--db #2``, ``--shards line 3``)."""
    return specs[i].where or f"--db #{i + 1}"


def _labelled_open(open_one: Callable[[str | None], Any], spec: DbSpec, label: str) -> Any:
    """``open_one(spec.url)`` for one of several stores; a database that is not there is named by
    where it was given (``--shards line 2 (b)``) and to be restored: a store given to read, or a
    member of a set, is not created (the store's own advice, ``fencepost init``, would be refused)."""
    from fencepost.errors import OpenError

    try:
        return open_one(spec.url)
    except OpenError as exc:
        if exc.code != "database_missing":
            raise
        named = label if spec.name is None else f"{label} ({spec.name})"
        raise fail(f"{named}: database_missing: its database does not exist; restore it "
                   "(or fix its URL)") from None


def _labels(specs: Sequence[DbSpec]) -> list[str]:
    return [_label(specs, i) for i in range(len(specs))]


def parse_db(value: str, where: str) -> DbSpec:
    """``URL`` or ``NAME=URL``. A URL always has ``scheme:`` before any ``=``, so the two never clash.

    ``where`` says which value is wrong (``--db #2``, ``--shards line 3``); the value is never echoed.
    """
    head, sep, tail = value.partition("=")
    if not sep or ":" in head or "/" in head:
        return DbSpec(None, _checked_url(value, where), where)
    if not _NAME.match(head):
        raise click.UsageError(f"{where}: a store name must be {NAME_RULE} (NAME=URL)")
    if not tail:
        raise click.UsageError(f"{where}: a URL must follow NAME=")
    return DbSpec(head, _checked_url(tail, where), where)


def _checked_url(url: str, where: str) -> str:
    """``url`` when it is a database URL fencepost can open; else a usage error naming the rule."""
    from fencepost._durable import parse_url

    try:
        parse_url(url)
    except ValueError as exc:
        raise click.UsageError(f"{where}: {exc}") from None
    return url


_COMMENT = re.compile(r"(^|\s)#.*$")
SHARD_FILE_MAX_BYTES = 1 << 20  # a shard list is a few lines: this bounds what /dev/zero or a wrong file costs


def read_shard_file(path: str) -> list[DbSpec]:
    """A shard file: one ``URL`` or ``NAME=URL`` a line; blank lines and ``#`` comments are skipped.

    A comment starts at a ``#`` at the start of a line or after whitespace, so it may follow a URL
    (a ``#`` inside a URL is no comment). A UTF-8 byte order mark and CRLF line ends are accepted.
    At most ``SHARD_FILE_MAX_BYTES`` are read: a larger regular file is refused by its size before
    any of it is read, and a pipe or device (``<(...)`` works) that goes on past the bound when it
    is reached.
    """
    too_large = f"more than the {SHARD_FILE_MAX_BYTES} bytes a shard file may hold (one URL or NAME=URL a line)"
    try:
        with open(path, "rb") as fh:
            info = os.fstat(fh.fileno())
            if stat.S_ISREG(info.st_mode) and info.st_size > SHARD_FILE_MAX_BYTES:
                raise click.UsageError(f"--shards: the file holds {info.st_size} bytes, {too_large}")
            data = fh.read(SHARD_FILE_MAX_BYTES + 1)
        if len(data) > SHARD_FILE_MAX_BYTES:
            raise click.UsageError(f"--shards: the file holds {too_large}")
        lines = data.decode("utf-8-sig").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else "not readable as UTF-8 text"
        raise click.UsageError(f"--shards: cannot read the file ({why})") from None
    entries = [(n, _COMMENT.sub("", line).strip()) for n, line in enumerate(lines, start=1)]
    specs = [parse_db(entry, f"--shards line {n}") for n, entry in entries if entry]
    if not specs:
        raise click.UsageError("--shards: the file names no store (one URL or NAME=URL a line)")
    _warn_if_others_may_read(path, info.st_mode, specs)
    return specs


def _warn_if_others_may_read(path: str, mode: int, specs: Sequence[DbSpec]) -> None:
    """One warning on stderr when a regular shard file that holds a password (any URL in it) may be
    read by its group or by others: it names the file and the fix, never the password. A warning,
    not a refusal (ssh refuses such a key file)."""
    from fencepost._durable import holds_secret

    if not stat.S_ISREG(mode) or not mode & (stat.S_IRGRP | stat.S_IROTH):
        return
    if any(spec.url is not None and holds_secret(spec.url) for spec in specs):
        quoted = shlex.quote(path)
        click.echo(f"Warning: --shards {quoted} holds a database password and other users may "
                   f"read it (mode {stat.S_IMODE(mode):04o}); make it private: chmod 600 {quoted}", err=True)


class CliContext:
    """The group's state: the stores given with ``--db`` (or ``--shards``), opened lazily on first use.

    One store (the usual case): ``store(readonly=...)``, exactly as before. Several stores:
    ``stores(readonly=...)`` opens them all as ``{name: Store}`` for the commands that read across
    stores (``runs list``, ``feed tail``; a multi-source ``projection`` can use the same call), and
    ``shard_urls``/``shard_set`` check that they form one recorded shard set for the commands that
    route by run id. A command that works on one store only refuses several with a usage error.
    """

    def __init__(self, url: str | None, specs: Sequence[DbSpec] | None = None) -> None:
        self.specs: list[DbSpec] = list(specs) if specs else [DbSpec(None, url)]
        self._store: Any = None
        self._stores: dict[str, Any] | None = None
        self._shard_sets: list[Any] = []

    # ------------------------------------------------------------------ one store
    @property
    def several(self) -> bool:
        """More than one store was given."""
        return len(self.specs) > 1

    @property
    def labelled(self) -> bool:
        """Output names each record's store: several stores, or one given as ``NAME=URL``."""
        return self.several or self.specs[0].name is not None

    @property
    def url(self) -> str | None:
        """The one store's URL as given (``None``: ``$FENCEPOST_DB`` or the default); refused for several."""
        self.one_store_only()
        url = self.specs[0].url
        if url is None and os.environ.get("FENCEPOST_DB"):
            _checked_url(os.environ["FENCEPOST_DB"], "$FENCEPOST_DB")  # checked as a --db value is
        return url

    @url.setter
    def url(self, value: str | None) -> None:
        self.specs = [DbSpec(None, value)]

    def one_store_only(self, why: str = "") -> None:
        """Refuse (usage error, exit 2) when several stores were given to a command that works on one."""
        if self.several:
            ctx = click.get_current_context(silent=True)
            command = ctx.command_path if ctx is not None else "this command"
            raise click.UsageError(f"{command} works on one store and {len(self.specs)} were given"
                                   f"{why or ': give one --db'}")

    def store(self, *, readonly: bool, opener: Callable[[str | None], Any] | None = None) -> Any:
        """Open the store once: read-only for read commands (never creates or migrates).

        ``opener(url)`` opens it instead of ``fencepost.open(url, readonly=readonly)`` (the console's
        opens a store whose server does not answer yet as one it waits for)."""
        self.one_store_only()
        if self._store is None:
            self._store = self._opener(readonly, opener)(self.url)
        return self._store

    @staticmethod
    def _opener(readonly: bool, opener: Callable[[str | None], Any] | None) -> Callable[[str | None], Any]:
        if opener is not None:
            return opener
        import fencepost

        return lambda url: fencepost.open(url, readonly=readonly)

    @property
    def resolved_url(self) -> str:
        from fencepost._durable import resolve_url

        return resolve_url(self.url)

    # ------------------------------------------------------------------ several stores
    def stores(self, *, readonly: bool, opener: Callable[[str | None], Any] | None = None) -> dict[str, Any]:
        """Every given store, opened once, as ``{name: Store}`` in the order given.

        A store's name is the one given (``NAME=URL``), else the shard name its shard set recorded
        in it, else ``shard-<i>`` by position (counted from 0, as ``open_shards`` names a list).
        Refused (usage error): two names alike, the same database twice, or only some shards of a
        recorded set. Read-only stores are never created or migrated. ``opener`` as for ``store``: a
        store it gives that waits for its database (``ui.awaited``) is named as given, else by
        position, and the checks that read a store (the same database twice, a recorded set given
        whole) run for it when it opens: failing them then, it is refused with their message.
        """
        if self._stores is None:
            if not self.several:
                self.url  # noqa: B018 - checks $FENCEPOST_DB as a --db value is checked
            open_one = self._opener(readonly, opener)
            opened: list[Any] = []
            try:
                for i, spec in enumerate(self.specs):
                    opened.append(_labelled_open(open_one, spec, _label(self.specs, i)) if self.several
                                  else open_one(spec.url))
                names = self._names(opened)
            except BaseException:
                for store in opened:
                    store.close()
                raise
            self._stores = dict(zip(names, opened, strict=True))
        return self._stores

    def _names(self, opened: Sequence[Any]) -> list[str]:
        from fencepost.shards import membership
        from fencepost.ui.awaited import check_as_they_open

        # A store that does not answer yet is checked when it opens (refused then if it fails).
        return check_as_they_open(opened, lambda store: (membership.read(store), store.feed.position().source),
                                  self._checked_names, refuses=(click.UsageError,))

    def _checked_names(self, facts: Sequence[tuple[Any, str] | None]) -> list[str]:
        """The stores' names, from each store's shard record and change-feed source (None for a
        store that does not answer); refused (usage error) as ``stores`` says."""
        answering = [fact is not None for fact in facts]
        records = [fact[0] if fact is not None else None for fact in facts]
        refuse_same_database(_labels(self.specs), [fact[1] if fact is not None else None for fact in facts])
        names = _named(self.specs, records)
        sets: dict[str, list[tuple[int, Any]]] = {}
        for i, rec in enumerate(records):
            if rec is not None:
                sets.setdefault(rec.set_id, []).append((i, rec))
        for members in sets.values():
            i, newest = max(members, key=lambda m: m[1].generation)
            given, recorded = {rec.shard_name for _, rec in members}, set(newest.members)
            # A store that does not answer yet may be one of the missing shards: not held against them.
            if given != recorded and not (given < recorded and len(recorded - given) <= answering.count(False)):
                raise click.UsageError(
                    f"{_label(self.specs, members[0][0])} is a shard of a set of {len(newest.members)} and "
                    f"{len(given)} of them were given: give every shard of the set")
        return names

    def shard_urls(self, *, create: bool, grow: bool = False) -> dict[str, str]:
        """The given stores as one shard set: ``{name: url}`` in member order, for ``open_shards``.

        ``create=False``: every store must exist and record the same set (all of its shards given).
        ``create=True`` (``init``; ``worker`` after proving every store exists): stores that do not
        exist yet are allowed (``open_shards`` creates and migrates them once the set checks out), and
        empty stores that record no set yet are named (``NAME=URL``, else ``shard-<i>``) to found one.
        ``grow=True`` (``init --grow``): the set's members in their recorded order, then the stores
        that record no set, as given, to be appended. Every store is only read here, never created
        or written.
        Anything else is a usage error (exit 2) that names the ``--db`` by position and changes nothing.
        """
        from fencepost.shards import membership

        urls = [spec.url or "" for spec in self.specs]
        if create:
            looks = membership.look_all(urls)  # read-only: a store that does not exist yet stays so
            records = [lk.record for lk in looks]
            empty = [lk.empty for lk in looks]
            refuse_same_database(_labels(self.specs), [lk.source for lk in looks], [lk.place for lk in looks])
        else:
            records, sources, empty = [], [], []
            for i, spec in enumerate(self.specs):
                with _labelled_open(self._opener(True, None), spec, _label(self.specs, i)) as store:
                    records.append(membership.read(store))
                    sources.append(store.feed.position().source)
                    empty.append(membership._empty(store))
            refuse_same_database(_labels(self.specs), sources)
        present = [(i, r) for i, r in enumerate(records) if r is not None]
        grown = max((r for _, r in present), key=lambda r: r.generation).members if present and grow else None
        names = _named(self.specs, records, grown)
        if not present:
            if not create:
                raise click.UsageError("the given stores record no shard set: found one with fencepost init "
                                       "(several --db), or give one --db")
            for i, is_empty in enumerate(empty):
                if not is_empty:
                    raise click.UsageError(f"{_label(self.specs, i)} holds runs and belongs to no shard set: "
                                           "a shard set is founded on empty stores only")
            return dict(zip(names, urls, strict=True))
        first_i, first = present[0]
        for i, rec in present:
            if rec.set_id != first.set_id:
                raise click.UsageError(f"{_label(self.specs, i)} belongs to another shard set than "
                                       f"{_label(self.specs, first_i)}")
        if len(present) < len(records) and not create:
            i = next(i for i, r in enumerate(records) if r is None)
            raise click.UsageError(f"{_label(self.specs, i)} is not a shard of the set the others belong to "
                                   "(to add it, fencepost init --grow)")
        newest = max((r for _, r in present), key=lambda r: r.generation)
        if grow:
            by_name = dict(zip(names, urls, strict=True))
            if not set(newest.members) <= set(by_name):
                raise click.UsageError(f"the shard set has {len(newest.members)} shards and "
                                       f"{sum(n in by_name for n in newest.members)} of them were given: "
                                       "give every shard of the set, then the stores to add")
            added = [n for n, r in zip(names, records, strict=True) if r is None or n not in newest.members]
            return {n: by_name[n] for n in [*newest.members, *added]}
        if len(present) == len(records) and set(names) == set(newest.members):
            by_name = dict(zip(names, urls, strict=True))
            return {name: by_name[name] for name in newest.members}
        if len(present) == len(records):
            raise click.UsageError(f"the shard set has {len(newest.members)} shards and {len(records)} "
                                   "were given: give every shard of the set, once")
        return dict(zip(names, urls, strict=True))  # a founding left unfinished: open_shards finishes it

    def shard_set(self, *, readonly: bool, create: bool = False, grow: bool = False) -> Any:
        """The given stores opened as one ``ShardSet`` (see ``shard_urls``); closed with the group.

        A refusal of ``open_shards`` names the stores as they were given (``--db #3``, ``--shards
        line 4``), not by their position in the set's member order.
        """
        import fencepost
        from fencepost.shards import ShardError

        urls = self.shard_urls(create=create and not readonly, grow=grow)
        try:
            shards = fencepost.open_shards(urls, readonly=readonly, grow=grow)
        except ShardError as exc:
            if exc.code != "membership_mismatch":
                raise
            given = [spec.url or "" for spec in self.specs]
            labels = [_label(self.specs, given.index(url)) for url in urls.values()]
            detail = re.sub(r"shard #(\d+)", lambda m: labels[int(m.group(1))], exc.detail)
            detail = (detail.replace("grow the set to add a store", "fencepost init --grow adds a store")
                      .replace("open with grow=True to finish it", "fencepost init --grow finishes it"))
            raise click.UsageError(f"the given stores do not form their recorded shard set: {detail}") from None
        self._shard_sets.append(shards)
        return shards

    def close(self) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None
        for store in (self._stores or {}).values():
            store.close()
        self._stores = None
        while self._shard_sets:
            self._shard_sets.pop().close()


def refuse_same_database(labels: Sequence[str], sources: Sequence[str | None],
                         places: Sequence[str] | None = None) -> None:
    """Refuse one database given twice (``membership.check_distinct``), as a usage error naming the
    stores by ``labels`` (``--db #2``, ``--shards line 4``)."""
    from fencepost.shards.membership import check_distinct

    check_distinct(places or [None] * len(sources), sources, labels=labels, error=click.UsageError)


def _named(specs: Sequence[DbSpec], records: Sequence[Any], members: Sequence[str] | None = None) -> list[str]:
    """Each store's name: given, else recorded as its shard name, else ``shard-<i>``; refuse clashes.

    ``members`` (a grow: the set's newest member list): a store that records no set takes, unless
    named, the first member name no given store records (a grow left unfinished), else
    ``shard-<i>`` with ``i`` its position in the grown member list, as ``open_shards`` names a list.
    """
    free: list[str] = []
    if members is not None:
        taken = {rec.shard_name for rec in records if rec is not None} | {s.name for s in specs if s.name}
        free = [m for m in members if m not in taken]
        free += [f"shard-{len(members) + k}" for k in range(len(specs))]
    names: list[str] = []
    for i, (spec, rec) in enumerate(zip(specs, records, strict=True)):
        if rec is not None and spec.name is not None and spec.name != rec.shard_name:
            raise click.UsageError(f"{_label(specs, i)} is recorded as a shard under another name: "
                                   "give its recorded name, or none")
        if spec.name is not None:
            name = spec.name
        elif rec is not None:
            name = rec.shard_name
        else:
            name = free.pop(0) if members is not None else f"shard-{i}"
        if name in names:
            raise click.UsageError(f"{_label(specs, i)} has the same name as {_label(specs, names.index(name))}: "
                                   "name the stores with --db NAME=URL")
        names.append(name)
    return names


def cli_context() -> CliContext:
    """The current invocation's ``CliContext`` (the root group makes it before any command runs)."""
    obj = click.get_current_context().find_object(CliContext)
    assert obj is not None
    return obj


def read_store() -> Any:
    """The store of the current invocation, opened read-only (refused when several were given)."""
    return cli_context().store(readonly=True)


def write_store(*, create: bool = True) -> Any:
    """The store of the current invocation, opened for writing (refused when several were given).

    ``create=True`` creates and migrates the database if needed (``init``, ``demo``);
    ``create=False`` first proves, read-only, that it already exists, so a mistyped URL given to
    ``runs cancel``, ``source rotate`` or ``worker`` is an error instead of a new empty database.
    """
    obj = cli_context()
    obj.one_store_only()
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


class StopRelay:
    """Sets ``event`` on behalf of signal handlers, without taking the event's lock in the handler.

    A Python signal handler runs in the main thread between two of its bytecodes, so a handler
    that calls ``event.set()`` deadlocks when the main thread already holds the event's lock: a
    second signal (Ctrl-C, then the SIGTERM a supervisor sends) arriving while the first handler
    is inside ``set()``, or a signal arriving while the main thread is inside ``event.wait()``.
    ``trigger`` (the handler) only writes a byte to a pipe; a small daemon thread reads it and sets
    the event.

    ``watch_output``: the same thread also sets ``event`` (and ``output_closed``) when the last
    reader of stdout goes away (``| head -3`` has what it wanted). A follower writes only when
    something happens, so it would learn that its pipe closed at its next write, and on a quiet
    store that write may never come. On a pipe or a socket, ``poll`` reports POLLERR (POLLHUP for a
    socket) on the write end as soon as no reader is left; a terminal or a file is never watched
    (it has no reader to lose).
    """

    def __init__(self, event: threading.Event, *, watch_output: bool = False) -> None:
        self.event = event
        self.output_closed = False
        self._output = _piped_stdout() if watch_output else None
        self._read, self._write = os.pipe()
        os.set_blocking(self._write, False)
        self._thread = threading.Thread(target=self._relay, daemon=True, name="fencepost-stop-relay")
        self._thread.start()

    def trigger(self, *_: object) -> None:
        """The signal handler: ask for the event to be set (async-signal-safe, never blocks)."""
        if self._write < 0:
            return  # closed: its descriptor number may already name another file
        try:
            os.write(self._write, b"\0")
        except OSError:  # a full pipe already holds a request
            pass

    def _relay(self) -> None:
        if self._output is None:
            while os.read(self._read, 64):  # empty: the write end was closed
                self.event.set()
        else:
            poller = select.poll()
            poller.register(self._read, select.POLLIN)
            poller.register(self._output, select.POLLERR | select.POLLHUP)
            while True:
                ready = [fd for fd, _ in poller.poll()]
                if self._output in ready:  # no reader left: watched no more
                    poller.unregister(self._output)
                    self.output_closed = True
                    self.event.set()
                if self._read in ready:
                    if not os.read(self._read, 64):
                        break
                    self.event.set()
        os.close(self._read)

    def close(self) -> None:
        """Stop relaying (a request already written is still relayed first)."""
        fd, self._write = self._write, -1
        os.close(fd)
        self._thread.join(timeout=5)


def _piped_stdout() -> int | None:
    """stdout's descriptor when it is a pipe or a socket (and ``poll`` exists), else None."""
    if not hasattr(select, "poll"):
        return None
    try:
        fd = sys.stdout.fileno()
        mode = os.fstat(fd).st_mode
    except (AttributeError, OSError, ValueError):  # replaced by an object without one, or closed
        return None
    return fd if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) else None


@contextmanager
def stop_on_signals(*, output: bool = False) -> Iterator[threading.Event]:
    """An event set by SIGTERM or the first Ctrl-C, for a loop that stops gracefully.

    SIGTERM is a normal stop (the command exits 0); Ctrl-C exits 130 once the loop has stopped. A
    second Ctrl-C interrupts at once. A process started with SIGINT ignored (a shell's background
    job) keeps ignoring it. Only the main thread may install the handlers.

    ``output``: the loop's output is what it is for (a follower printing changes), so the event is
    also set when stdout is a pipe whose reader has gone; the command then exits 1, as any command
    whose output pipe closes, without a word.
    """
    stop = threading.Event()
    relay = StopRelay(stop, watch_output=output)
    interrupted: list[bool] = []

    def on_interrupt(*_: object) -> None:
        interrupted.append(True)
        relay.trigger()
        signal.signal(signal.SIGINT, signal.default_int_handler)

    previous_term = signal.signal(signal.SIGTERM, relay.trigger)
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
        relay.close()
    if interrupted:
        raise SystemExit(INTERRUPTED)
    if relay.output_closed:
        _discard_stdout()
        raise SystemExit(1)


def _discard_stdout() -> None:
    """Point stdout at the null device: what is left in its buffer must not fail the exit's flush."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    finally:
        os.close(devnull)


def progress_columns() -> tuple[Any, ...]:
    """The columns of every progress bar the command line draws (the demo's too): what is being
    done, the bar, ``done/total`` and the time elapsed."""
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn

    return TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()


def progress_option(fn: Callable) -> Callable:
    """Add ``--no-progress`` to a long-running command; pass the choice as ``progress`` (bool)."""
    return click.option("--no-progress", "no_progress", is_flag=True,
                        help="Draw no progress bar (one is drawn on stderr only when stderr is a terminal).")(
        _pass_progress(fn))


def _pass_progress(fn: Callable) -> Callable:
    import functools

    @functools.wraps(fn)
    def wrapper(*args: Any, no_progress: bool, **kwargs: Any) -> Any:
        return fn(*args, progress=not no_progress, **kwargs)

    return wrapper


@contextmanager
def progress_bar(description: str, *, enabled: bool = True) -> Iterator[Callable[[int, int], None] | None]:
    """A progress bar on stderr for long work, as a library ``on_progress(done, total)`` callback.

    Yields ``None`` (the library then counts nothing) unless ``enabled`` and stderr is a terminal:
    a pipe or a file, and so a script or a ``--format json`` consumer, sees nothing more on stderr
    and the same bytes on stdout. Each call sets the bar to ``done`` of ``total`` (a read the library
    retries starts it again from 0). The bar is removed when the block ends, before the result prints.
    """
    if not enabled or not sys.stderr.isatty():
        yield None
        return
    from rich.progress import Progress

    with Progress(*progress_columns(), console=err_console, transient=True) as bar:
        task = bar.add_task(printable_text(description), total=None)

        def on_progress(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        yield on_progress


def printable_text(text: str) -> str:
    """``text`` with nothing a terminal acts on, and no rich markup read from it."""
    from rich.markup import escape

    from fencepost._printable import one_line

    return escape(one_line(text))


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
