"""The one output layer of every read command: ``--format table|json|jsonl|csv`` (``--json`` is ``json``).

A command builds *records*, plain ``dict`` values with snake_case keys, and hands them to the
``Output`` its ``@output_options`` decorator passes in as ``out``:

- ``out.rows(records, columns)`` for a list, ``out.record(record, fields)`` for one object,
  ``out.stream(columns)`` for an unbounded sequence (``feed tail --follow``).
- ``table``: a rich table on a terminal; written to a pipe or a file, plain aligned columns, one
  record per line, never folded (``fencepost runs list | grep <id>`` finds the id).
- ``json``: one document (a list is an array); ``jsonl``: one object per line; ``csv``: a header and
  one row per record, nested values as JSON text, booleans ``true``/``false`` as JSON spells them.

Keys are snake_case throughout. User data (a run's ``state``, a journal entry's ``payload`` and
``meta``) is shown as it was recorded. ``to_data`` turns library structs into such records.
"""

from __future__ import annotations

import codecs
import csv
import functools
import re
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import click
import msgspec

from fencepost._printable import one_line, printable

FORMATS = ("table", "json", "jsonl", "csv")

_encoder = msgspec.json.Encoder()
_CAMEL = re.compile(r"(?<=[a-z0-9])([A-Z])")
def redacted_first_line(exc: BaseException, empty: str) -> str:
    """The first line of ``exc``'s message (``empty`` when it has none), redacted by the default rules
    as a run failure's message is (it may quote a credential: ``password=...``, a connection string)
    and escaped for a terminal; withheld when it cannot be formatted or redacted (the redactor's own
    error may quote it)."""
    from fencepost.journal.redaction import DEFAULT as DEFAULT_REDACTION
    from fencepost.journal.redaction import redact_diagnostics

    try:
        redacted = redact_diagnostics(DEFAULT_REDACTION, {"message": str(exc)})["message"]
    except Exception:
        return "(message withheld: it could not be redacted)"
    lines = redacted.strip().splitlines() if type(redacted) is str else []
    return one_line(lines[0]) if lines else empty


@dataclass(frozen=True)
class Column:
    """One table column: its ``header``, how to render a record's cell, and whether it may wrap.

    ``key`` names the record field shown; ``render`` (optional) turns the record into the cell text.
    ``wrap=False`` (identifiers) never breaks the value across lines, even on a narrow terminal.
    """

    header: str
    key: str
    render: Callable[[Mapping[str, Any]], Any] | None = None
    wrap: bool = True

    def cell(self, record: Mapping[str, Any]) -> str:
        value = self.render(record) if self.render is not None else record.get(self.key)
        return cell_text(value)


def cell_text(value: Any) -> str:
    """A cell's text: ``-`` for none, JSON for structures, ``str`` otherwise."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, dict | list | tuple | msgspec.Struct):
        return _encoder.encode(value).decode()
    return str(value)


def snake(key: str) -> str:
    """``observedAtMs`` -> ``observed_at_ms`` (already snake_case keys are unchanged)."""
    return _CAMEL.sub(r"_\1", key).lower()


def snake_keys(value: Any) -> Any:
    """``value`` with every mapping key, at every depth, in snake_case (for library-made documents)."""
    if isinstance(value, dict):
        return {snake(str(k)): snake_keys(v) for k, v in value.items()}
    if isinstance(value, list):
        return [snake_keys(v) for v in value]
    return value


def to_data(value: Any) -> Any:
    """A library value (structs, lists, dicts) as JSON-ready builtins; tagged structs keep ``type``."""
    return msgspec.to_builtins(value)


class Output:
    """Where one invocation's result goes, in the format the user chose."""

    def __init__(self, fmt: str) -> None:
        self.format = fmt

    @property
    def is_table(self) -> bool:
        return self.format == "table"

    # ------------------------------------------------------------------ lists
    def rows(
        self,
        records: Sequence[Mapping[str, Any]],
        columns: Sequence[Column],
        *,
        title: str | None = None,
        footer: Iterable[str] = (),
        document: Any = None,
        fields: Sequence[str] = (),
    ) -> None:
        """Print a list of records; ``document`` replaces the array as the ``json`` output.

        ``fields``: the keys every record has, in order, for the ``csv`` header when there is no
        record to take them from (a CSV reader then reads an empty table, not an empty file).
        """
        if self.format == "json":
            _write_json(list(records) if document is None else document)
        elif self.format == "jsonl":
            for r in records:
                _write_json(r)
        elif self.format == "csv":
            _write_csv(records, fields)
        else:
            _write_table(title, columns, [[c.cell(r) for c in columns] for r in records], cut=True)
            for line in footer:
                click.echo(printable(line))

    # ------------------------------------------------------------------ one object
    def record(
        self,
        record: Mapping[str, Any],
        fields: Sequence[tuple[str, Any]] | None = None,
        *,
        title: str | None = None,
        notes: Iterable[str] = (),
    ) -> None:
        """Print one object; in a table as ``field | value`` rows (``fields``, else every key)."""
        if self.format in ("json", "jsonl"):
            _write_json(record)
        elif self.format == "csv":
            _write_csv([record])
        else:
            pairs = fields if fields is not None else list(record.items())
            _write_table(title, [Column("field", "field", wrap=False), Column("value", "value")],
                         [[str(k), cell_text(v)] for k, v in pairs])
            for line in notes:
                click.echo(printable(line))

    # ------------------------------------------------------------------ unbounded
    def stream(self, columns: Sequence[Column], fields: Sequence[str] = ()) -> Callable[[Mapping[str, Any]], None]:
        """A printer for records that keep coming: JSON formats print one object per line (``json``
        too, since the stream has no end), ``csv`` prints its header once, a table one plain line each.

        ``fields``: the keys every record has, in order: ``csv`` prints them as its header at once,
        so a stream with no record is still a CSV table (its header), not an empty file.
        """
        if self.format in ("json", "jsonl"):
            return _write_json
        if self.format == "csv":
            target = _MachineOut()
            writerow = _csv_writer(target)
            header: list[str] | None = list(fields) or None
            if fields:
                writerow(fields)
                target.flush()

            def csv_line(record: Mapping[str, Any]) -> None:
                nonlocal header
                if header is None:
                    header = list(record)
                    writerow(header)
                writerow([_csv_cell(record.get(k)) for k in header])
                target.flush()

            return csv_line

        def line(record: Mapping[str, Any]) -> None:
            click.echo("  ".join(_one_line(printable(c.cell(record))) if c.wrap else one_line(c.cell(record))
                                 for c in columns))

        return line

    def message(self, text: str) -> None:
        """A human sentence, printed only in table format (machine formats carry the data alone)."""
        if self.is_table:
            click.echo(printable(text))


def output_options(fn: Callable) -> Callable:
    """Add ``--format table|json|jsonl|csv`` and its alias ``--json``; pass the choice as ``out``."""

    @click.option("--format", "output_format", type=click.Choice(FORMATS), default=None,
                  help="Output format.  [default: table]")
    @click.option("--json", "as_json", is_flag=True, help="Same as --format json.")
    @functools.wraps(fn)
    def wrapper(*args: Any, output_format: str | None, as_json: bool, **kwargs: Any) -> Any:
        if as_json and output_format not in (None, "json"):
            raise click.UsageError("--json and --format are exclusive (--json means --format json)")
        return fn(*args, out=Output("json" if as_json else output_format or "table"), **kwargs)

    return wrapper


# ---------------------------------------------------------------------- writers
def _write_json(value: Any) -> None:
    try:
        text = _encoder.encode(value).decode()
    except UnicodeEncodeError:  # a lone surrogate, which msgspec refuses: JSON escapes it instead
        import json

        text = _surrogates_escaped(json.dumps(to_data(value), ensure_ascii=False, separators=(",", ":")))
    out = _MachineOut()
    out.write(text + "\n")
    out.flush()


class _MachineOut:
    """Standard output for the machine formats (JSON, CSV), which are UTF-8 whatever encoding the
    interpreter gave stdout: ``PYTHONIOENCODING=ascii`` made every non-ASCII value fail the command,
    a CSV part-way through its rows."""

    def __init__(self) -> None:
        out = sys.stdout
        raw = getattr(out, "buffer", None)
        self._text = out
        self._bytes = None if raw is None or codecs.lookup(out.encoding or "utf-8").name == "utf-8" else raw
        if self._bytes is not None:
            out.flush()  # what was written as text goes first

    def write(self, text: str) -> int:
        if self._bytes is None:
            return self._text.write(text)
        self._bytes.write(text.encode("utf-8"))
        return len(text)

    def flush(self) -> None:
        (self._text if self._bytes is None else self._bytes).flush()


_SURROGATE = re.compile("[\ud800-\udfff]")


def _surrogates_escaped(text: str) -> str:
    """``text`` with each lone surrogate written ``\\uDCFF``: in JSON the same text, decoded; in CSV,
    which has no escape, six characters a UTF-8 output can hold (it cannot hold the surrogate)."""
    return _SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", text) if _SURROGATE.search(text) else text


def _csv_cell(value: Any) -> Any:
    """A CSV cell: empty for none, ``true``/``false`` as JSON spells them, JSON text for structures."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict | list | tuple | msgspec.Struct):
        try:
            return _encoder.encode(value).decode()
        except UnicodeEncodeError:  # a lone surrogate (see _write_json)
            import json

            return _surrogates_escaped(json.dumps(to_data(value), ensure_ascii=False, separators=(",", ":")))
    return _surrogates_escaped(value) if isinstance(value, str) else value


def _csv_writer(target: Any) -> Callable[[Sequence[Any]], None]:
    """Write one CSV row a line (``\n``). A row with a cell holding a carriage return is quoted
    whole: the csv module quotes only the line terminator's own characters, and CSV readers take a
    lone CR for the end of a line, which split such a row in two."""
    plain = csv.writer(target, lineterminator="\n")
    quoted = csv.writer(target, lineterminator="\n", quoting=csv.QUOTE_ALL)

    def writerow(row: Sequence[Any]) -> None:
        (quoted if any(type(c) is str and "\r" in c for c in row) else plain).writerow(row)

    return writerow


def _write_csv(records: Sequence[Mapping[str, Any]], fields: Sequence[str] = ()) -> None:
    target = _MachineOut()
    writerow = _csv_writer(target)
    header: list[str] = [] if records else list(fields)
    for r in records:
        header += [k for k in r if k not in header]
    if header:
        writerow(header)
    for r in records:
        writerow([_csv_cell(r.get(k)) for k in header])
    target.flush()


# On a terminal, a list too wide for whole identifiers is printed as plain lines; its free-text
# cells are cut to this many terminal cells there, so a record takes a line or two, not a screen.
_PLAIN_CUT = 24
_ELLIPSIS = "\u2026"


def _write_table(title: str | None, columns: Sequence[Column], cells: list[list[str]], *, cut: bool = False) -> None:
    """``cut`` (a list of records): on a terminal, free-text cells are cut with an ellipsis so each
    record keeps one row; identifiers stay whole (they are copied). Anywhere else nothing is cut."""
    # What the store holds is shown, never obeyed: control characters escaped before any layout.
    title = printable(title) if title is not None else None
    shown = [printable if c.wrap else one_line for c in columns]  # identifiers: one line, line ends escaped
    cells = [[show(v) for show, v in zip(shown, row, strict=True)] for row in cells]
    from rich.cells import cell_len

    terminal = sys.stdout.isatty()
    if terminal:
        from rich.console import Console

        console = Console(highlight=False)
        if cut:
            cells = [[_one_line(v) for v in row] for row in cells]
        widths = [max([cell_len(c.header)] + [cell_len(row[i]) for row in cells]) for i, c in enumerate(columns)]
        # Identifier columns at full width, the others at least 6 wide, plus borders and padding.
        needed = sum(w if not c.wrap else min(w, 6) for w, c in zip(widths, columns, strict=True))
        frame = 3 * len(columns) + 1
        if needed + frame <= console.width:
            limits = _free_widths(columns, widths, console.width - frame) if cut else None
            _rich_table(console, title, columns, cells, widths, limits)
            return
        # Too narrow for whole identifiers: plain lines (the terminal wraps them, the ids stay whole).
        if cut:
            cells = [[_cut(v, _PLAIN_CUT) if c.wrap else v for c, v in zip(columns, row, strict=True)]
                     for row in cells]
    # A pipe or a file: plain aligned columns, one record per line, nothing folded or cropped.
    # Cells never contain a newline (they would break "one record per line").
    # Padded by terminal cells, not characters: a CJK character takes two, a combining mark none.
    rows = [[c.header for c in columns]] + [[_one_line(v) for v in row] for row in cells]
    widths = [max(cell_len(r[i]) for r in rows) for i in range(len(columns))]
    for r in rows:
        click.echo("  ".join(v + " " * (w - cell_len(v)) for v, w in zip(r, widths, strict=True)).rstrip())


def _free_widths(columns: Sequence[Column], widths: list[int], room: int) -> list[int | None]:
    """The widest each free-text column may be so the table fits ``room`` cells of content: the
    identifiers take their whole width first, the free-text columns share the rest, a narrow one
    keeping its own width and leaving what it does not need to the wider ones. None: no limit."""
    left = room - sum(w for w, c in zip(widths, columns, strict=True) if not c.wrap)
    free = sorted((w, i) for i, (w, c) in enumerate(zip(widths, columns, strict=True)) if c.wrap)
    limits: list[int | None] = [None] * len(columns)
    for k, (w, i) in enumerate(free):
        given = max(1, min(w, left // (len(free) - k)))
        limits[i] = given
        left -= given
    return limits


def _cut(text: str, width: int) -> str:
    """``text`` in at most ``width`` terminal cells, its end replaced by an ellipsis when cut."""
    from rich.cells import cell_len, set_cell_size

    if cell_len(text) <= width:
        return text
    return set_cell_size(text, width - 1).rstrip() + _ELLIPSIS


def _rich_table(console: Any, title: str | None, columns: Sequence[Column], cells: list[list[str]],
                widths: list[int], limits: list[int | None] | None = None) -> None:
    """``limits``: the widest each free-text column may be, its cells cut with an ellipsis to one
    line (a list of records); without them, free text folds."""
    from rich.table import Table
    from rich.text import Text

    t = Table(title=title, show_lines=False, header_style="bold")
    for k, (c, w) in enumerate(zip(columns, widths, strict=True)):
        limit = None if limits is None else limits[k]
        if limit is not None:
            t.add_column(c.header, no_wrap=True, overflow="ellipsis", max_width=limit)
        else:
            # An identifier column is as wide as its longest value: never folded, never cropped.
            t.add_column(c.header, no_wrap=not c.wrap, overflow="fold", min_width=None if c.wrap else w)
    for row in cells:
        t.add_row(*[Text(v) for v in row])  # Text: a cell is never read as rich markup
    console.print(t)


def _one_line(text: str) -> str:
    return " ".join(text.splitlines()) if "\n" in text or "\r" in text else text
