"""``fencepost init`` and ``fencepost runs list|show|cancel|create|retry|delete``."""

from __future__ import annotations

import json
import re
import shlex
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import click
import msgspec

from fencepost._printable import one_line
from fencepost._values import MAXIMUM_JSON_DEPTH, ascii_digits
from fencepost.changefeed.merged import listing_page, merged_page
from fencepost.cli._common import (
    MAX_SAFE_INTEGER,
    CliContext,
    JsonText,
    NonEmpty,
    RunIdType,
    cli_context,
    error_text,
    fail,
    owner_text,
    read_store,
    when,
    write_store,
)
from fencepost.cli._output import Column, Output, output_options, snake_keys, to_data
from fencepost.runstore._reading import RunWarning, reconfirm_warnings

STATUSES = ("pending", "running", "suspended", "completed", "failed", "cancelled")


class RunDetail(msgspec.Struct, frozen=True):
    """What ``runs show`` reports: the row and its warnings (the run keeps its recorded status)."""

    run: Any
    warnings: list[RunWarning]


@click.command()
@click.option("--grow", is_flag=True,
              help="Add stores to the shard set the others record (several --db): give every shard of "
                   "the set and the new stores; they are appended to the set.")
@click.pass_obj
def init(obj: CliContext, grow: bool) -> None:
    """Create the database (if needed) and apply every migration; say which of the three it did.

    Prints "created" (a new store, every migration applied), "migrated" (the migrations it applied
    to an existing store) or "current" (nothing to do; also for a current store this user may read
    but not write). A database newer than this version of fencepost, or one that records a
    migration under another name, is refused. It creates the SQLite file's directory when that does
    not exist, and says so. To apply the SQL by hand instead, see fencepost migrations sql.

    Given several --db (or --shards), does so for each and founds them as one shard set (empty
    stores only; NAME=URL names a shard, else shard-0, shard-1 ... by position), or checks the set
    they already record. With --grow, the stores that record no set are added to the set the others
    record (stop the set's writers first; existing runs stay where they are). Prints a line per
    store, then the set's shard names.

    Example: fencepost --db sqlite:///.flows/flows.db init
    """
    from fencepost._durable import redact_url

    if grow and not obj.several:
        raise click.UsageError("--grow adds stores to a shard set: give every shard of the set and the new "
                               "stores (several --db, or --shards)")
    if obj.several:
        shards = obj.shard_set(readonly=False, create=True, grow=grow)
        by_url = {store.db.url: store for store in shards.shard_stores()}
        for spec in obj.specs:  # in the order given
            store = by_url[spec.url]
            click.echo(_init_line(store, redact_url(store.db.url)))
        click.echo(f"shard set of {len(shards)} stores: {', '.join(shards.names)}")
        return
    from fencepost.errors import OpenError

    missing = _missing_directory(obj.resolved_url)
    try:
        store = write_store()
    except OpenError as exc:
        if exc.code != "permission_denied":
            raise
        click.echo(_read_only_init(obj.url, exc))
        return
    line = _init_line(store, redact_url(obj.resolved_url))
    if missing is not None and missing.is_dir():
        line += f"; created the directory {missing}"
    click.echo(line)


def _missing_directory(url: str) -> Path | None:
    """The directory of a SQLite URL's file when it does not exist yet (the open creates it)."""
    from fencepost._durable import parse_url

    try:
        parsed, _ = parse_url(url)
    except ValueError:
        return None  # the open refuses it, naming the rule
    if parsed.get_backend_name() != "sqlite":
        return None
    directory = Path(parsed.database or "").parent
    try:
        return None if directory.exists() else directory
    except OSError:  # a path the system refuses to look at: the open says why
        return None


def _read_only_init(url: str | None, refused: Any) -> str:
    """``init`` by someone who may read the store but not write it (a 0444 file, a read-only
    directory, a PostgreSQL role with SELECT only): ``current`` when nothing is pending, for nothing
    needs writing; else the refusal, naming the pending migrations of an existing store."""
    from fencepost._durable import Database, DbFailure, redact_url, resolve_url
    from fencepost._migrations import STORE_NAMESPACES, discover, pending, pending_phrase
    from fencepost.errors import FencepostError, OpenError

    todo = None
    try:
        db = Database(resolve_url(url), readonly=True)
    except (FencepostError, ValueError):
        raise refused from None
    try:
        def check() -> Any:
            db.probe()
            return pending(db)

        todo = db.vetted(check)  # leaves a SQLite file as it was
    except OpenError as exc:
        if exc.code in ("schema_too_new", "schema_mismatch"):
            raise  # what is wrong with the store comes before who may write it
    except (DbFailure, FencepostError):
        pass
    finally:
        db.dispose()
    if todo is None:
        raise refused from None
    if todo:
        if len(todo) == len(discover(db.backend.migration_suffix, STORE_NAMESPACES)):
            raise refused from None  # not a store yet: nothing more to say
        if pending_phrase(todo) in refused.detail:
            raise refused from None  # the open's refusal already names them
        raise OpenError(refused.code, refused.method, f"{refused.detail}; {pending_phrase(todo)}",
                        db_code=refused.db_code) from None
    return f"current: {redact_url(db.url)} (no migration to apply; read-only for this user, nothing written)"


def _init_line(store: Any, where: str) -> str:
    from fencepost._migrations import STORE_NAMESPACES, discover

    done = store.migrations_applied
    everything = [m.id for m in discover(store.db.backend.migration_suffix, STORE_NAMESPACES)]
    if not done:
        return f"current: {where} (no migration to apply)"
    if list(done) == everything:
        return f"created {where} ({len(done)} migrations applied)"
    return f"migrated {where}: applied {len(done)} migration(s): {', '.join(str(i) for i in done)}"


@click.group()
def runs() -> None:
    """List, inspect, create, retry, cancel and delete runs."""


def run_record(row: Any) -> dict[str, Any]:
    """A run row as the CLI prints it: the ``RunRow`` fields, snake_case at every depth, with the
    decoded ``state`` beside the verbatim ``state_json`` (``state`` is null when that is not JSON)."""
    record: dict[str, Any] = {}
    for key, value in to_data(row).items():
        record[key] = snake_keys(value) if key == "cancel_acknowledgement" else value
        if key == "state_json":
            try:
                record["state"] = msgspec.json.decode(value)
            except msgspec.DecodeError:
                record["state"] = None
    return record


def _run_fields() -> list[str]:
    """The keys of every ``run_record``, in order: the ``RunRow`` fields, ``state`` after ``state_json``."""
    from fencepost.runstore.rows import RunRow

    fields: list[str] = []
    for name in RunRow.__struct_fields__:
        fields += [name, "state"] if name == "state_json" else [name]
    return fields


def _flow(record: Mapping[str, Any]) -> Any:
    state = record.get("state")
    flow = state.get("flowName") if isinstance(state, dict) else None
    return flow if isinstance(flow, str) else None


RUN_COLUMNS = [
    Column("run_id", "run_id", wrap=False),
    Column("status", "status", wrap=False),
    Column("flow", "flow", _flow),
    Column("owner", "owner", lambda r: owner_text(_owner(r.get("owner")))),
    Column("heartbeat", "heartbeat_at_ms", lambda r: when(r.get("heartbeat_at_ms")), wrap=False),
    Column("cancel", "cancel_requested_at_ms",
           lambda r: "requested" if r.get("cancel_requested_at_ms") is not None else "-"),
    Column("created", "created_at_ms", lambda r: when(r.get("created_at_ms")), wrap=False),
]


def _owner(value: Any) -> Any:
    from fencepost.journal.owner import OwnerId

    return OwnerId(value["host_id"], value["pid"], value["nonce"]) if isinstance(value, dict) else None


class Instant(click.ParamType):
    """A point in time: epoch milliseconds, or an ISO-8601 date/time (UTC unless it names an offset)."""

    name = "TIME"

    def convert(self, value: Any, param: Any, ctx: Any) -> int:
        if isinstance(value, int):
            return value
        text = str(value).strip()
        if ascii_digits(text):
            # More digits than the largest stamp has: out of range, before int() refuses thousands of them.
            return self._in_range(int(text) if len(text) <= 17 else MAX_SAFE_INTEGER + 1, param, ctx)
        from datetime import UTC, datetime

        try:
            moment = datetime.fromisoformat(text.replace("Z", "+00:00") if text.endswith("Z") else text)
        except ValueError:
            self.fail("must be epoch milliseconds or an ISO-8601 time such as 2026-01-31T12:00:00Z", param, ctx)
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)
        return self._in_range(int(moment.timestamp() * 1000), param, ctx)

    def _in_range(self, ms: int, param: Any, ctx: Any) -> int:
        if not 0 <= ms <= MAX_SAFE_INTEGER:
            self.fail(f"must be from 1970-01-01 (epoch ms 0) to epoch ms {MAX_SAFE_INTEGER}", param, ctx)
        return ms


def list_filters(statuses: tuple[str, ...], flow: str | None, after: int | None,
                 before: int | None) -> dict[str, Any]:
    """The ``list_runs`` filters of the command line options (several statuses: any of them)."""
    filters: dict[str, Any] = {}
    if statuses:
        filters["status"] = statuses[0] if len(statuses) == 1 else list(statuses)
    if flow is not None:
        filters["flow_name"] = flow
    if after is not None:
        filters["created_after_ms"] = after
    if before is not None:
        filters["created_before_ms"] = before
    return filters


def list_page(store: Any, filters: dict[str, Any], cursor: str | None, limit: int,
              descending: bool) -> tuple[list[Any], str | None]:
    """Up to ``limit`` runs after ``cursor`` and the cursor that resumes right after the last one."""
    listed, cursor = listing_page(store, filters, cursor, limit, descending)
    return _rows(store, [r.run_id for r in listed]), cursor


def _rows(store: Any, run_ids: list[str]) -> list[Any]:
    from fencepost.errors import RunStoreError

    rows = []
    for run_id in run_ids:
        try:
            rows.append(store.runs.get(run_id))
        except RunStoreError as exc:
            if exc.code != "not_found_row":  # deleted between the page and the read
                raise
    return rows


#: The formats that print the number of matching runs ("showing N of M", json's "total").
_COUNTED = frozenset({"table", "json"})


@runs.command("list")
@click.option("--status", "statuses", multiple=True, type=click.Choice(STATUSES),
              help="Only runs in this status (repeatable: any of them).")
@click.option("--flow", metavar="NAME", default=None, type=NonEmpty(),
              help="Only runs of this flow: the string flowName of the run's state.")
@click.option("--created-after", "after", type=Instant(), default=None,
              help="Only runs created at or after this time (epoch ms or ISO-8601, UTC by default).")
@click.option("--created-before", "before", type=Instant(), default=None,
              help="Only runs created at or before this time.")
@click.option("--desc", "descending", is_flag=True, help="Newest first.")
@click.option("--cursor", default=None, metavar="CURSOR",
              help="Continue a listing where the previous page ended (give the same filters and order).")
@click.option("--limit", default=100, show_default=True, type=click.IntRange(1, 100_000),
              help="At most this many runs.")
@output_options
def runs_list(statuses: tuple[str, ...], flow: str | None, after: int | None, before: int | None,
              descending: bool, cursor: str | None, limit: int, out: Output) -> None:
    """List runs, oldest first (by creation time, then run id), one page at a time.

    A table ends with "showing N of M" and, when more runs match, the --cursor of the next page.
    With --format json, prints {"runs": [...], "next_cursor": ..., "total": M}; jsonl and csv print
    the runs alone. Each run has the RunRow fields and "state", its state_json decoded.

    Across several stores (--db repeated) it is one listing merged by creation time, each run with
    "store", its store's name (the first column of a table); --cursor resumes it with the same
    stores, and the total counts every store.

    Example: fencepost runs list --status running --desc --limit 20
    """
    filters = list_filters(statuses, flow, after, before)
    obj = cli_context()
    if obj.labelled:
        _list_across(obj.stores(readonly=True), filters, cursor, limit, descending, out)
        return
    store = read_store()
    rows, next_cursor = list_page(store, filters, cursor, limit, descending)
    # Only the table and the json document print the total: counting reads every matching run.
    total = store.feed.count_runs(filters) if out.format in _COUNTED else None
    records = [run_record(r) for r in rows]
    footer = [f"showing {len(records)} of {total}"]
    if next_cursor is not None:
        footer.append(f"next page: --cursor {pasteable(next_cursor)}")
    out.rows(records, RUN_COLUMNS, title=f"{len(records)} run(s)", footer=footer,
             document={"runs": records, "next_cursor": next_cursor, "total": total}, fields=_run_fields())


STORE_COLUMN = Column("store", "store", wrap=False)


def _list_across(stores: dict[str, Any], filters: dict[str, Any], cursor: str | None, limit: int,
                 descending: bool, out: Output) -> None:
    """One page of runs merged from several stores by (created, run id), each labelled with its store."""
    shown, next_cursor = merged_page(stores, filters, cursor, limit, descending, page=list_page)
    total = sum(store.feed.count_runs(filters) for store in stores.values()) if out.format in _COUNTED else None
    records = [{"store": name, **run_record(row)} for name, row in shown]
    footer = [f"showing {len(records)} of {total} in {len(stores)} stores"]
    if next_cursor is not None:
        footer.append(f"next page: --cursor {pasteable(next_cursor)}")
    out.rows(records, [STORE_COLUMN, *RUN_COLUMNS], title=f"{len(records)} run(s)", footer=footer,
             document={"runs": records, "next_cursor": next_cursor, "total": total},
             fields=["store", *_run_fields()])


def pasteable(cursor: str) -> str:
    """``cursor`` as a table prints it to be pasted back: shell-quoted, and ASCII. A cursor is JSON
    text holding the last run id shown; a table escapes what a terminal must not show raw (``\\xa0``
    for U+00A0), which JSON would not read back, so every non-ASCII character is written as the JSON
    escape ``\\uNNNN`` instead: the same cursor once decoded."""
    if not cursor.isascii():
        try:
            cursor = json.dumps(json.loads(cursor), ensure_ascii=True, separators=(",", ":"))
        except ValueError:
            pass  # not JSON: shown as it is (escaped by the table)
    return shlex.quote(cursor)


@runs.command("show")
@click.argument("run_id", type=RunIdType())
@output_options
def runs_show(run_id: str, out: Output) -> None:
    """Show one run: its row, and a warning for every lease-reconfirmed decision.

    A reconfirmed run keeps its recorded status: the warning says its owner worked for a while
    without a confirmed heartbeat, then proved it still held the lease. With --format json:
    {"run": {...}, "warnings": [...]}.

    Example: fencepost runs create order-17 && fencepost runs show order-17 --format json
    """
    store = run_store(run_id, readonly=True)
    detail = RunDetail(store.runs.get(run_id), reconfirm_warnings(store, run_id))
    run = run_record(detail.run)
    warnings = to_data(detail.warnings)
    r = detail.run
    if out.format == "csv":
        out.record({**run, "warnings": warnings})
        return
    out.record({"run": run, "warnings": warnings}, [
        ("run_id", one_line(r.run_id)),
        ("status", r.status),
        ("state_json", r.state_json if len(r.state_json) <= 200 else r.state_json[:200] + "..."),
        ("created", when(r.created_at_ms)),
        ("started", when(r.started_at_ms)),
        ("finished", when(r.finished_at_ms)),
        ("heartbeat", when(r.heartbeat_at_ms)),
        ("owner", owner_text(r.owner)),
        ("claimant", owner_text(r.claimant)),
        ("claimed", when(r.claimed_at_ms)),
        ("cancel requested", when(r.cancel_requested_at_ms)),
        ("cancel acknowledged", "yes" if r.cancel_acknowledgement else "-"),
        ("parent", None if r.parent_run_id is None else one_line(r.parent_run_id)),
        # A run that was never retried is round 0 of its own lineage, as the change feed says.
        ("lineage / round", f"{one_line(r.lineage_id or r.run_id)} / {r.round_ordinal or 0}"),
    ], title=f"run {one_line(r.run_id)}", notes=[
        *failure_lines(r.failure),
        *(f"warning lease-reconfirmed: owner ran {w.unconfirmed_ms} ms unconfirmed "
          f"(journal seq {w.seq}, {when(w.occurred_at_ms)})" for w in detail.warnings)])


def failure_lines(failure: Any) -> list[str]:
    """Why a run failed, for people: the exception type and message, then its recorded traceback."""
    if failure is None:
        return []
    return [f"failed with {failure.type}: {failure.message}", failure.traceback.rstrip("\n")]


@runs.command("cancel")
@click.argument("run_id", type=RunIdType())
@output_options
def runs_cancel(run_id: str, out: Output) -> None:
    """Request cancellation of a run (its owner acknowledges and settles it as cancelled).

    A running run becomes cancelled when its function next calls check() or checkpoint() (within a
    heartbeat interval it is acknowledged). A pending or suspended run has no owner: it stays
    pending, with the request recorded, until a worker next claims it, and that worker settles it
    cancelled at once without calling the function.

    Exits 0 when the request is recorded or already was; 1 (the reason on stderr) when the run is
    unknown or already settled. Given the shards of a set (--db repeated), acts on the run's shard.

    Example: fencepost runs create order-17 && fencepost runs cancel order-17
    """
    from fencepost.runstore.outcomes import AlreadyRequested, CancelRequested, Terminal

    store = run_store(run_id, readonly=False)
    outcome = store.runs.request_cancel(run_id, store.clock.now_ms())
    if isinstance(outcome, Terminal):
        raise fail(f"run is already settled ({outcome.status}): nothing to cancel")
    if not isinstance(outcome, CancelRequested | AlreadyRequested):
        from fencepost.errors import RunStoreError

        # The words every other command uses for an unknown run.
        raise fail(str(RunStoreError("not_found_row", "request_cancel", "no run with this id")))
    if out.is_table:
        done = "cancellation requested" if isinstance(outcome, CancelRequested) else "already requested"
        out.message(f"{one_line(run_id)}: {done}")
    else:
        out.record({"run_id": run_id, **to_data(outcome)})


def run_store(run_id: str, *, readonly: bool) -> Any:
    """The store holding ``run_id``: the one store, or, given several, its shard in their shard set.

    Several ``--db`` must form one recorded shard set (all of its shards); the run is found as the
    set finds it (its placed shard first, then the others). One store: read-only for reads; for
    writes it must already exist.
    """
    obj = cli_context()
    if not obj.several:
        return read_store() if readonly else write_store(create=False)
    shards = obj.shard_set(readonly=readonly)
    # ``locate``, not ``store_for``: ``journal show`` also takes a companion stream's own id, which
    # ``store_for`` refuses (no run can have it); one store reads it, so does its shard.
    return shards[shards.locate(run_id)]


def _create_on_shard(obj: CliContext, run_id: str, state_json: str, out: Output) -> None:
    shards = obj.shard_set(readonly=False)
    shards.runs.create(run_id, state_json)
    home = shards.locate(run_id)
    if out.is_table:
        out.message(f"created {one_line(run_id)} on {home}")
    else:
        out.record({"store": home, **run_record(shards.runs.get(run_id))})


# --------------------------------------------------------------------------- operator commands
def _parse_ndjson(stream: Any) -> tuple[list[tuple[str, str]], list[int]]:
    """``{"run_id": ..., "state": <JSON>}`` per line of UTF-8 bytes (blank lines skipped, a byte order
    mark before the first accepted), and the line number each pair came from; errors name the line,
    never its content."""
    pairs: list[tuple[str, str]] = []
    line_numbers: list[int] = []
    for n, raw in enumerate(stream, start=1):
        try:
            line = raw.decode("utf-8-sig" if n == 1 else "utf-8")
        except UnicodeDecodeError:
            raise click.ClickException(f"stdin line {n}: not UTF-8 text") from None
        if not line.strip():
            continue
        try:
            doc = msgspec.json.decode(line)
        except msgspec.DecodeError:
            raise click.ClickException(f"stdin line {n}: not valid JSON") from None
        except RecursionError:  # nested deeper than the decoder goes, and so than the store's limit
            raise click.ClickException(f"stdin line {n}: JSON nested past the depth limit of "
                                       f"{MAXIMUM_JSON_DEPTH}; no run was created") from None
        if type(doc) is not dict or type(doc.get("run_id")) is not str:
            raise click.ClickException(f'stdin line {n}: expected an object with a string "run_id"')
        extra = set(doc) - {"run_id", "state"}
        if extra:
            raise click.ClickException(f"stdin line {n}: unknown field(s) {', '.join(sorted(extra))}")
        pairs.append((doc["run_id"], msgspec.json.encode(doc.get("state", {})).decode()))
        line_numbers.append(n)
    return pairs, line_numbers


_RUNS_INDEX = re.compile(r"runs\[(\d+)\](\.?)")


def _on_stdin_lines(exc: Exception, line_numbers: list[int]) -> click.ClickException:
    """A refusal of ``create_many`` naming ``runs[i]`` (an index over the runs alone, from 0) as the
    user counts: ``stdin line N``. Nothing was created; the message says so, and names no value."""
    def line(m: re.Match[str]) -> str:
        i = int(m.group(1))
        where = f"stdin line {line_numbers[i]}" if i < len(line_numbers) else m.group(0)
        return f"{where}: " if m.group(2) else where

    text = _RUNS_INDEX.sub(line, error_text(exc))
    return fail(f"{text}; no run was created")


# Extra arguments reach the command, which refuses them pointing to --state (see runs_create).
@runs.command("create", context_settings={"allow_extra_args": True})
@click.argument("run_id", type=RunIdType(new=True))
@click.option("--state", "state_json", default="{}", show_default=True, type=JsonText(),
              help="The run's initial state, stored byte for byte.")
@output_options
def runs_create(run_id: str, state_json: str, out: Output) -> None:
    """Create a pending run (a worker then claims and runs it).

    RUN_ID "-" reads NDJSON from stdin instead, one run per line:
    {"run_id": "...", "state": {...}}. All of them are created in one transaction, or none (a
    bad line or an id that already exists changes nothing). The database must exist (fencepost init).
    Given the shards of a set (--db repeated), the run is created on the shard its id places on
    (RUN_ID "-" needs one store that is no shard of a set); one shard of a set given alone is refused.
    With RUN_ID "-" and --format json, prints {"created": [...]}; jsonl and csv print one
    {"run_id"} row per created run.

    Example: fencepost runs create order-17 --state '{"step": 0}'
    """
    ctx = click.get_current_context()
    if ctx.args:
        # ``runs create ID '{...}'``: the library's ``runs.create(id, state)`` typed here. click would
        # say only "Got unexpected extra argument", quoting the state (which may hold a secret).
        many = "s" if len(ctx.args) > 1 else ""
        raise click.UsageError(f"unexpected extra argument{many} after RUN_ID (not repeated here): give the run's "
                               "state as --state JSON, as in fencepost runs create order-17 --state '{\"step\": 0}'")
    obj = cli_context()
    if run_id == "-" and ctx.get_parameter_source("state_json") is click.core.ParameterSource.COMMANDLINE:
        raise click.UsageError("--state does not apply to runs create -: give each line's \"state\"")
    if run_id == "-":
        if sys.stdin is None:  # started with its input closed (``<&-``)
            raise click.UsageError("runs create - reads the runs from standard input, which is closed")
        obj.one_store_only(": runs create - creates every run in one transaction, which never spans "
                           "stores (give one --db)")
    if obj.several:
        _create_on_shard(obj, run_id, state_json, out)
        return
    store = write_store(create=False)
    _refuse_one_shard(store)
    if run_id == "-":
        from fencepost.errors import RunStoreError

        stdin = sys.stdin.buffer  # the bytes under the text stream (click.get_binary_stream is deprecated)
        if stdin.isatty():  # typed at a terminal: say what it waits for (a pipe or a file needs no word)
            click.echo('reading runs from stdin, one JSON object a line ({"run_id": "...", "state": {...}}); '
                       "end with Ctrl-D", err=True)
        pairs, line_numbers = _parse_ndjson(stdin)
        try:
            created = store.runs.create_many(pairs)
        except RunStoreError as exc:
            if not _RUNS_INDEX.search(str(exc)):
                raise
            raise _on_stdin_lines(exc, line_numbers) from None
        if out.is_table:
            out.message(f"created {created} run(s)")
        else:
            # json: the document {"created": [...]}; jsonl and csv: one row per run, as listings print.
            out.rows([{"run_id": rid} for rid, _ in pairs], [], document={"created": [rid for rid, _ in pairs]},
                     fields=["run_id"])
        return
    store.runs.create(run_id, state_json)
    if out.is_table:
        out.message(f"created {one_line(run_id)}")
    else:
        out.record(run_record(store.runs.get(run_id)))


def _refuse_one_shard(store: Any) -> None:
    """A new run id on one shard of a set, given alone, could be one another shard already holds:
    the set places ids and checks every shard, so creating goes through the whole set."""
    from fencepost.shards import membership

    record = membership.read(store)
    if record is not None and len(record.members) > 1:
        raise click.UsageError(
            f"this store is shard {record.shard_name} of a set of {len(record.members)}: a run created on it "
            "alone could reuse an id another shard holds; give every shard of the set (--db repeated, or --shards)")


@runs.command("retry")
@click.argument("run_id", type=RunIdType())
@click.option("--new-id", "new_run_id", default=None, metavar="ID", type=RunIdType(new=True),
              help="The new round's run id. Default: <lineage>.retry-<round>.")
@output_options
def runs_retry(run_id: str, new_run_id: str | None, out: Output) -> None:
    """Start a new round of a settled run's lineage from its last checkpoint.

    The new run is pending, with the state the lineage's latest round ended with, and joins the
    lineage (fencepost runs show prints lineage / round). Refused while the latest round is still
    live, or while any round of the lineage has a cancellation request. Journaled on the lineage's
    stream as flows.run-store.retried.

    Example: fencepost runs retry order-17
    """
    cli_context().one_store_only(
        ": a shard set routes no retry (give the --db of the run's shard)")
    store = write_store(create=False)
    row = store.runs.retry(run_id, new_run_id=new_run_id)
    if not out.is_table:
        out.record(run_record(row))
    else:
        out.message(f"created {one_line(row.run_id)}: round {row.round_ordinal} of lineage "
                    f"{one_line(row.lineage_id)}, pending, from the last state of {one_line(row.parent_run_id)}")


@runs.command("delete")
@click.argument("run_id", type=RunIdType())
@click.option("--force", is_flag=True,
              help="Also delete a running or claimed run, releasing its lease in the same transaction.")
@output_options
def runs_delete(run_id: str, force: bool, out: Output) -> None:
    """Delete a run and its step attempts.

    Change-feed readers (fencepost feed tail, projections) see the deletion. The journal is
    append-only and keeps the run's history. A running or claimed run is refused unless --force;
    a run other runs name as their parent is refused. With --format json: {"run_id", "deleted":
    true, "forced"}.

    Example: fencepost runs delete order-17
    """
    from fencepost.errors import RunStoreError

    store = run_store(run_id, readonly=False)
    try:
        store.runs.delete(run_id, force=force)
    except RunStoreError as exc:
        status = getattr(exc, "cause", {}).get("status")
        if exc.code == "refused" and status is not None:  # owned or claimed: name the option
            raise fail("refused: a worker holds this run (running or claimed); --force releases its lease "
                       "and deletes it") from None
        raise
    if out.is_table:
        out.message(f"deleted {one_line(run_id)}")
    else:
        out.record({"run_id": run_id, "deleted": True, "forced": force})
