"""The console's ASGI application: server-rendered pages, one event stream, two static files.

Read-only by construction: ``create_app`` opens the store with ``readonly=True`` (or refuses a
store that was opened for writing), every route answers ``GET``/``HEAD`` only, and no route calls a
store method that writes. Templates autoescape; static files are a fixed list read from the
package, so no request path ever reaches the file system.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import time
from collections.abc import AsyncIterator, Mapping
from importlib import resources
from typing import Any, NamedTuple
from urllib.parse import quote, unquote

import jinja2
import msgspec
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.convertors import Convertor, register_url_convertor
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from fencepost._values import ascii_digits
from fencepost.errors import FencepostError, PersistenceError, SourceChanged
from fencepost.ui import views
from fencepost.ui.awaited import AwaitedStore, check_as_they_open, open_or_await
from fencepost.ui.escaping import exact_attr, shown
from fencepost.ui.hub import FeedHub, MultiFeedHub, catch_up, sse

log = logging.getLogger("fencepost.ui")
_encoder = msgspec.json.Encoder()

#: Longest query string accepted (bytes); a listing cursor is far shorter.
MAX_QUERY_BYTES = 4096
#: Longest request path accepted (bytes): room for the longest run id the store takes (1024 UTF-16
#: units, each at most 9 bytes percent-encoded) after ``/runs/<store>/``.
MAX_PATH_BYTES = 10 * 1024
#: Seconds between keep-alive comments on an idle event stream.
KEEPALIVE_S = 15.0
STATIC = {"app.js": "text/javascript; charset=utf-8", "app.css": "text/css; charset=utf-8",
          "favicon.svg": "image/svg+xml"}
SECURITY_HEADERS = [
    (b"content-security-policy",
     b"default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
     b"base-uri 'none'; form-action 'self'; frame-ancestors 'none'"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
    (b"cache-control", b"no-store"),
]


#: Seconds a client is told to wait (``Retry-After``) before it asks again while the database is
#: out of reach; the 503 page reloads itself after as long.
RETRY_AFTER_S = 5
#: What a page says while the store's database is out of reach: no URL, host or path.
UNREACHABLE = ("the store's database cannot be reached or read right now; this page reloads itself "
               "and answers again once the database is back")
#: Codes of a store error raised because its database did not answer a read (a server stopped or
#: unreachable, a file moved away or replaced, tables gone). A stored value that cannot be decoded
#: is no outage: ``decode_failed``, or one of these with that as its ``cause``.
_READ_FAILURES = frozenset({"persistence_failed", "read_failed", "list_failed"})


def database_down(exc: FencepostError) -> bool:
    """Whether ``exc`` says the store's database is out of reach, not that a row or the store is bad.

    True for a failed read of the database, for a store the console still waits to open (an
    ``OpenError``) and for a store the console already knows does not answer; False for a stored
    value that cannot be decoded (a listing's ``list_failed`` for one has ``decode_failed`` as its
    cause) and for a store refused when it opened late.
    """
    from fencepost.errors import OpenError

    if isinstance(exc, OpenError):
        return exc.code != "refused"  # a store that opened late and failed a start-up check is no outage
    cause = getattr(exc, "cause", None)
    if isinstance(cause, dict) and cause.get("code") == "decode_failed":
        return False
    if isinstance(exc, PersistenceError) and exc.method == "console":
        # The console's own reads, and a store it knows does not answer (by that store's error code).
        return exc.code not in ("refused", "decode_failed")
    return exc.code in _READ_FAILURES


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback addresses (the console's default exposure)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


#: Host names a console on loopback answers to: another name is a DNS-rebinding page reaching it.
#: A loopback address literal (``127.0.0.2``, the one ``--host`` bound) is answered too: a
#: rebinding page names its own host, never an address.
LOOPBACK_NAMES = frozenset({"127.0.0.1", "localhost", "::1"})


def _loopback_literal(name: str) -> bool:
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False

#: Run ids a browser would resolve as a dot segment even percent-encoded (``%2e%2e`` is ``..``):
#: their page is addressed with ``?id=`` instead.
_DOT_SEGMENTS = frozenset({".", ".."})


def run_href(run_id: str, store: str = "") -> str:
    """The console's address of a run's page: ``/runs/<run id>``, or ``/runs/<store>/<run id>`` over
    several stores, the id percent-encoded whole (``/`` too), so that any id the store accepts comes
    back exactly: newlines and other control characters, ``%``, ``?``, ``#``, backslashes, dot
    segments inside it. An id that is ``.`` or ``..`` is given as ``/runs/?id=..`` (or
    ``/runs/<store>/?id=..``), since a browser resolves such a segment before it sends the request.
    """
    base = f"/runs/{quote(store, safe='')}/" if store else "/runs/"
    if run_id in _DOT_SEGMENTS:
        return f"{base}?id={quote(run_id, safe='')}"
    return base + quote(run_id, safe="")


class _AnyText(Convertor[str]):
    """A path parameter matching any text, line breaks included (a run id may hold any character)."""

    regex = "(?s:.*)"

    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: str) -> str:
        return value


register_url_convertor("fencepost_any_text", _AnyText())


def _path_problem(raw: str) -> bool:
    """Whether a request path has a dot segment or a NUL, which no page's address has.

    Encoded forms count too (decoded twice, a backslash read as a slash), except in a run's id after
    ``/runs/``: that is data, not a path, and the store accepts ``..``, ``a\\b`` or ``%2e`` in an id.
    There only the segments a browser itself would resolve (``..``, ``%2e%2e``) and a NUL count.
    """
    head, runs, tail = raw.partition("/runs/")
    if runs and not head:
        decoded = unquote(tail)
        segments = [unquote(s) for s in tail.split("/")]
    else:
        decoded = unquote(unquote(raw))
        segments = decoded.replace("\\", "/").split("/")
    return ".." in segments or "." in segments or "\x00" in decoded


def _host_name(header: bytes) -> str:
    text = header.decode("latin-1").strip().lower()
    if text.startswith("["):
        return text[1:text.find("]")] if "]" in text else text
    return text.rsplit(":", 1)[0] if text.count(":") == 1 else text


class Guard:
    """Refuse what no page needs before any route sees it: long or traversing paths, long queries,
    a ``Host`` the console does not answer to.

    Also stamps every response with the security headers (a strict CSP: scripts and styles only
    from this server, nothing inline, no frames).
    """

    def __init__(self, app: ASGIApp, templates: jinja2.Environment, allowed_hosts: frozenset[str] | None) -> None:
        self.app = app
        self.templates = templates
        self.allowed_hosts = allowed_hosts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        raw = scope.get("raw_path") or scope["path"].encode()
        query = scope.get("query_string", b"")
        problem = None
        host = dict(scope.get("headers") or []).get(b"host", b"")
        name = _host_name(host)
        if self.allowed_hosts is not None and name not in self.allowed_hosts and not _loopback_literal(name):
            problem = (400, "invalid_host", "the request names a host this console does not serve")
        elif len(raw) > MAX_PATH_BYTES:
            problem = (414, "path_too_long", f"the request path is longer than {MAX_PATH_BYTES} bytes")
        elif len(query) > MAX_QUERY_BYTES:
            problem = (414, "query_too_long", f"the query string is longer than {MAX_QUERY_BYTES} bytes")
        elif _path_problem(raw.decode("latin-1")):
            problem = (400, "invalid_path", "the request path has a dot segment or a NUL")

        async def send_with_headers(message: Any) -> None:
            if message["type"] == "http.response.start":
                message = dict(message)
                message["headers"] = [*message.get("headers", []), *SECURITY_HEADERS]
            await send(message)

        if problem is not None:
            status, code, detail = problem
            body = self.templates.get_template("error.html").render(status=status, code=code, detail=detail,
                                                                    page="error")
            await HTMLResponse(body, status_code=status)(scope, receive, send_with_headers)
            return
        await self.app(scope, receive, send_with_headers)


class Refused(NamedTuple):
    """An error page to render instead of a run's page."""

    status: int
    code: str
    detail: str


def _route_run(named: Mapping[str, Any], path: str, given: str | None,
               known_down: Mapping[str, str]) -> tuple[str, str] | Refused | RedirectResponse:
    """Which store and run a run page path names in a console over several stores.

    ``<store>/<run id>`` (or ``<store>/`` and ``?id=<run id>``) is the run's page. Anything else
    (``/runs/<run id>`` or ``/runs/?id=<run id>``, as a console over one store links) is looked up in
    every store: held by one, it redirects to the run's page.
    """
    name, sep, rest = path.partition("/")
    if sep and not rest and given:
        rest = given
    if name in named and rest:
        return name, rest
    from fencepost.runstore._reading import run_exists

    run_id = path or given or ""
    # A store that does not answer cannot say whether it holds the run: the stores that answer
    # decide (a link from a single-store console keeps working while another store is down); none
    # of them holding it, the page fails with the store's error rather than a 404 that may be wrong.
    found, down = views.each_store(named, lambda _, s: run_exists(s, run_id), known_down=known_down)
    holders = [n for n in named if found.get(n)]
    if not holders and down:
        raise PersistenceError(next(iter(down.values()))["error"], "console", "a store does not answer")
    if len(holders) == 1:
        return RedirectResponse(run_href(run_id, holders[0]), status_code=307)
    if len(holders) > 1:
        return Refused(409, "ambiguous_run", f"{len(holders)} stores hold a run with this id: "
                                              "open it as /runs/STORE/RUN_ID")
    if sep and name not in named:
        return Refused(404, "unknown_store", "no store of this console has this name")
    return Refused(404, "not_found_row", "no run with this id in any store")


def _position_json(position: Any) -> dict[str, Any]:
    return {"source": position.source if position else None, "revision": position.revision if position else None}


_SINCE = ("since must be the feed position a console page was rendered at: SOURCE:REVISION, or "
          "NAME=SOURCE:REVISION,... over several stores")


def _down(text: str | None) -> frozenset[str]:
    """``?down=NAME,...``: the stores a page over several stores was rendered without, each once.

    Names this console does not serve are not refused here: they are of a page a console over
    other stores rendered (it restarted meanwhile), which ``_since`` sends a ``reset``."""
    if not text:
        return frozenset()
    given = text.split(",")
    if "" in given or len(set(given)) != len(given):
        raise views.BadInput("invalid_options", "down must name stores of this console, each once: NAME,NAME,...")
    return frozenset(given)


def _since(text: str | None, names: list[str] | None, down: frozenset[str] = frozenset()) -> dict[str, Any]:
    """``?since=`` as ``{store name: Position}`` ("" over one store); ``{}`` when not given.

    ``SOURCE:REVISION`` over one store, ``NAME=SOURCE:REVISION`` comma-separated over several (a
    few dozen bytes a store, well inside the query limit). A store in ``down`` (the page was
    rendered without it) may be left out. A page of other stores than this console's (it was
    rendered by a console over one store and this one serves several, or the reverse, or over other
    names: the console restarted with other stores) gets an impossible position for each of its
    stores: the stream resets and the page reloads, rather than a ``400`` it would retry for ever.
    """
    from fencepost.changefeed import Position
    from fencepost.changefeed.feed import _check_requested_position
    from fencepost.errors import RunStoreError

    stores: dict[str, Position] = {}
    named = False
    try:
        for i, part in enumerate(text.split(",") if text else []):
            name, sep, at = part.rpartition("=")
            if (sep and not name) or name in stores or (i and bool(sep) != named):
                raise ValueError
            named = bool(sep)
            source, _, revision = at.partition(":")
            if not ascii_digits(revision, 16):
                raise ValueError
            stores[name] = _check_requested_position(Position(source, int(revision)), "since")
    except (ValueError, RunStoreError):
        raise views.BadInput("invalid_options", _SINCE) from None
    impossible = Position("0" * 32, 0)
    if names is None:
        return {"": impossible} if named or down else stores
    if (stores and not named) or not down <= set(names) or (stores and set(stores) | down != set(names)):
        return {n: impossible for n in names}
    return stores


def _templates() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("fencepost.ui", "templates"),
        autoescape=jinja2.select_autoescape(["html", "xml"], default=True),
        undefined=jinja2.StrictUndefined,
        finalize=shown,
    )
    env.filters["exact_attr"] = exact_attr
    env.globals["run_href"] = run_href
    env.globals["retry_after"] = RETRY_AFTER_S
    return env


def _named_stores(url: str | Mapping[str, str] | None, store: Any, stores: Any) -> tuple[dict[str, Any], bool]:
    """The console's stores as ``{name: Store}`` and whether the app opened (and so owns) them.

    A store the app opens whose database does not answer yet (its server not running) is served
    as down until it does (``awaited.open_or_await``); any other failure to open it is raised.
    """
    given = sum(x is not None for x in (url, store, stores))
    if given > 1:
        raise ValueError("give the console a url (or a mapping of name to url), a store, or stores: one of them")
    if isinstance(url, Mapping):
        if not url:
            raise ValueError("the console needs at least one store")
        opened: dict[str, Any] = {}
        try:
            for name, each in url.items():
                opened[name] = open_or_await(each)
            _check_stores(opened)
        except BaseException:
            for each_store in opened.values():
                each_store.close()
            raise
        return opened, True
    if stores is not None:
        named = dict(stores.items())
        if not named:
            raise ValueError("the console needs at least one store")
        _check_stores(named)
        return named, False
    if store is None:
        return {"": open_or_await(url)}, True
    if not _readonly(store):
        raise ValueError("the console serves only a store opened with readonly=True")
    return {"": store}, False


def _readonly(store: Any) -> bool:
    """Whether ``store`` was opened read-only (a store the console waits for opens read-only)."""
    return isinstance(store, AwaitedStore) or store.db.readonly


def _check_stores(named: Mapping[str, Any]) -> None:
    from fencepost.shards.membership import check_distinct, check_name

    for i, (name, store) in enumerate(named.items()):
        check_name(name, i)
        if not _readonly(store):
            raise ValueError("the console serves only stores opened with readonly=True")
    # A store that does not answer yet is checked when it opens (refused then if it fails).
    labels = [f"store {name!r}" for name in named]
    check_as_they_open(list(named.values()), lambda store: store.feed.position().source,
                       lambda sources: check_distinct([None] * len(sources), sources, labels=labels, error=ValueError),
                       refuses=(ValueError,))


def create_app(url: str | Mapping[str, str] | None = None, *, store: Any = None, stores: Any = None,
               poll_interval: float = 2.0, tick: float = 1.0,
               allowed_hosts: frozenset[str] | None = LOOPBACK_NAMES) -> Starlette:
    """The console for the database at ``url`` (opened read-only), or for a read-only ``store``.

    Several stores: ``url`` a mapping of store name to URL (each opened read-only), or ``stores`` a
    mapping of name to read-only ``Store`` or a ``ShardSet`` opened with ``readonly=True``. The
    runs listing is then merged across them, a run is addressed as ``/runs/<store>/<run id>``, and
    the journal, projections and health pages show a section per store. One store serves exactly
    the single-store console.

    The app owns the stores it opened and the feed hub: both start with the app's lifespan and are
    closed with it. ``allowed_hosts`` are the ``Host`` names it answers to (default: loopback
    names only, which turns away DNS-rebinding pages); ``None`` answers to any name.
    """
    named, owned = _named_stores(url, store, stores)
    several = len(named) > 1
    store = next(iter(named.values()))
    templates = _templates()
    if several:
        hub: FeedHub = MultiFeedHub(named, stats=lambda h: views.stats_across(named, h), poll_interval=poll_interval,
                                    tick=tick)
    else:
        hub = FeedHub(store, stats=lambda h: views.stats(store, h), poll_interval=poll_interval, tick=tick)
    names = list(named) if several else []

    def page(request: Request, name: str, http_status: int = 200, **context: Any) -> HTMLResponse:
        context.setdefault("store_names", names)
        context.setdefault("down", {})
        html = templates.get_template(name).render(request=request, **context)
        return HTMLResponse(html, status_code=http_status)

    def error(request: Request, status: int, code: str, detail: str) -> HTMLResponse:
        return page(request, "error.html", status, status=status, code=code, detail=detail, page="error")

    def known_down() -> dict[str, str]:
        """The stores the hub found not answering (name: error code): pages do not wait on them."""
        return dict(hub.down) if several else {}  # type: ignore[attr-defined]

    def position_of() -> tuple[dict[str, Any], dict[str, Any]]:
        """The feed position(s) a page is rendered at, read before the page's own reads: its script
        gives it back to the event stream, which first sends what changed after it. Over several
        stores, also the stores that do not answer (``views.down_part`` each): their position is
        null, and the page is rendered without them."""
        if several:
            positions, down = views.each_store(named, lambda _, s: s.feed.position(), known_down=known_down())
            return {"stores": {n: _position_json(positions.get(n)) for n in named}}, down
        return _position_json(store.feed.position()), {}

    async def runs(request: Request) -> Response:
        try:
            position, down = await run_in_threadpool(position_of)
            if several:
                data = await run_in_threadpool(views.runs_page_across, named, request.query_params, set(down))
            else:
                data = await run_in_threadpool(views.runs_page, store, request.query_params)
        except views.BadInput as exc:
            return error(request, 400, exc.code, exc.detail)
        if several:
            answering = {n: s for n, s in named.items() if n not in down}
            found, more_down = await run_in_threadpool(views.each_store, answering,
                                                       lambda _, s: views.status_counts(s))
            down.update(more_down)
            counts = {s: sum(c[s] for c in found.values()) for s in views.STATUSES}
            # Each store's own counts: the page takes a store's live ones only when they are not
            # older than its position of that store (each store's stats carry their own as_of).
            store_counts: str | None = _encoder.encode(found).decode()
        else:
            counts = await run_in_threadpool(views.status_counts, store)
            store_counts = None
        return page(request, "runs.html", page="runs", counts=counts, statuses=views.STATUSES, down=down,
                    store_counts=store_counts, position=_encoder.encode(position).decode(), **data)

    async def run(request: Request) -> Response:
        # /runs/<run id>, else /runs/?id=<run id> (the form run_href gives an id a browser would resolve)
        run_id = request.path_params["run_id"]
        try:
            views.given_once(request.query_params, ("id", "fragment"))
        except views.BadInput as exc:
            return error(request, 400, exc.code, exc.detail)
        given = request.query_params.get("id")
        name = ""
        if several:
            found = await run_in_threadpool(_route_run, named, run_id, given, known_down())
            if isinstance(found, Refused):
                return error(request, *found)
            if isinstance(found, RedirectResponse):
                return found
            name, run_id = found
            code = known_down().get(name)
            if code is not None:  # its page would wait on a store known not to answer
                raise PersistenceError(code, "console", "the store does not answer")
        elif not run_id and given:
            run_id = given
        fragment = request.query_params.get("fragment") == "1"
        position, down = (None, {}) if fragment else await run_in_threadpool(position_of)
        data = await run_in_threadpool(views.run_detail, named[name] if several else store, run_id)
        if data is None:
            return error(request, 404, "not_found_row", "no run with this id" + (f" in store {name}" if name else ""))
        if fragment:
            return page(request, "run_body.html", page="run", store_name=name, **data)
        # The other stores that do not answer are not this page's concern: not marked, but given to
        # the page's stream (data-down), which has the page reload once they answer again.
        return page(request, "run.html", page="run", store_name=name, position=_encoder.encode(position).decode(),
                    down_names=" ".join(down), **data)

    async def sections_of(read: Any, key: str | None = None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """A section per store that answers (``read(name, store)``: its fields, or under ``key``),
        and the stores that do not; a console over one store has one unnamed section."""
        def one(n: str, s: Any) -> dict[str, Any]:
            value = read(n, s)
            return {key: value} if key is not None else value

        if several:
            found, down = await run_in_threadpool(views.each_store, named, one, False, known_down())
            return [{"name": n, **found[n]} for n in named if n in found], down
        return [{"name": "", **await run_in_threadpool(one, "", store)}], {}

    def health_of(name: str, s: Any) -> dict[str, Any]:
        return views.health(s, hub, name if several else None)

    async def journal(request: Request) -> Response:
        sections, down = await sections_of(lambda _, s: views.journal_overview(s))
        return page(request, "journal.html", page="journal", sections=sections, down=down,
                    verify_every_s=round(views.VERIFY_FROM_START_S))

    async def projections(request: Request) -> Response:
        sections, down = await sections_of(lambda _, s: views.projections(s), "projections")
        return page(request, "projections.html", page="projections", sections=sections, down=down)

    async def health(request: Request) -> Response:
        sections, down = await sections_of(health_of, "health")
        return page(request, "health.html", page="health", sections=sections, down=down)

    async def health_json(request: Request) -> Response:
        # Over several stores a store that does not answer is its error code (and database) in
        # place of its health; an error only when none answers, as over one store: a 503 when a
        # store's database is out of reach (as for the pages), else a 500 (a store refused when it
        # opened late, a stored value that cannot be decoded: no outage that waiting cures).
        if several:
            failures: dict[str, FencepostError] = {}
            found, down = await run_in_threadpool(views.each_store, named, health_of, True, known_down(), failures)
            if not found:
                log.warning("console: no store could answer a page (%s)", next(iter(down.values()))["error"])
                if any(database_down(exc) and down[n]["error"] != "refused" for n, exc in failures.items()):
                    return JSONResponse({"stores": down}, status_code=503,
                                        headers={"retry-after": str(RETRY_AFTER_S)})
                return JSONResponse({"stores": down}, status_code=500)
            return JSONResponse({"stores": {n: found[n] if n in found else down[n] for n in named}})
        try:
            data = await run_in_threadpool(health_of, "", store)
        except FencepostError as exc:
            log.warning("console: the store could not answer a page (%s)", exc.code)
            if database_down(exc):
                return JSONResponse(views.down_part(store, exc.code), status_code=503,
                                    headers={"retry-after": str(RETRY_AFTER_S)})
            return JSONResponse(views.down_part(store, exc.code), status_code=500)
        return JSONResponse(data)

    async def events(request: Request) -> Response:
        # ?since=: the position the page was rendered at (or last saw, when it reconnects). The
        # changes after it are sent first, then the live ones the hub broadcasts, the ones already
        # sent skipped: nothing that changed between the render and now is missed, nothing repeated.
        # ?down=: the stores the page was rendered without (they did not answer); the stream has the
        # page reload (``reset``) once one of them answers again.
        try:
            views.given_once(request.query_params, ("since", "down"))
            down = _down(request.query_params.get("down"))
            since = _since(request.query_params.get("since"), list(named) if several else None, down)
        except views.BadInput as exc:
            return error(request, 400, exc.code, exc.detail)
        headers = {"x-accel-buffering": "no"}
        if request.method == "HEAD":
            # The stream's headers and an ended message (length 0, so that even a client that reads
            # a body after HEAD stops): no page to feed, so no subscription to the hub.
            return Response(b"", media_type="text/event-stream", headers=headers)
        sub = hub.subscribe()
        opened = time.monotonic()

        def replay() -> tuple[list[bytes], dict[str, Any], dict[str, str]] | str:
            frames: list[bytes] = []
            reached: dict[str, Any] = {}
            failed: dict[str, str] = {}  # over several stores: a store that does not answer is skipped
            for name, position in since.items():
                try:
                    found = catch_up((named[name] if several else store).feed, position)
                except SourceChanged:
                    return "source_changed"
                except FencepostError as exc:
                    if not several:
                        raise
                    failed[name] = exc.code
                    continue
                if found is None:
                    return "too_far_behind"
                events, reached[name] = found
                for data in events:
                    if several:
                        frames.append(sse("run", {"store": name, **data}, f"{name}:{data['revision']}"))
                    else:
                        frames.append(sse("run", data, str(data["revision"])))
            return frames, reached, failed

        def answered_again(blind: set[str]) -> bool:
            """Whether a store the page has nothing (or not everything) of answered since the stream opened."""
            answered = getattr(hub, "answered_at", {})
            return any(answered.get(name, 0.0) > opened for name in blind)

        async def stream() -> AsyncIterator[bytes]:
            try:
                yield b"retry: 1000\n\n"
                reached: dict[str, Any] = {}
                failed: dict[str, str] = {}
                if since:
                    try:
                        replayed = await run_in_threadpool(replay)
                    except FencepostError as exc:  # the database went away: the page retries
                        yield sse("unavailable", {"error": exc.code})
                        return
                    if isinstance(replayed, str):  # the page reloads, once: its position means nothing here
                        yield sse("reset", {"reason": replayed})
                        return
                    frames, reached, failed = replayed
                    for frame in frames:
                        yield frame
                # What changed in a store the page was rendered without, or could not be caught up
                # with, is not on the page: it reloads once that store answers again.
                blind = set(down) | set(failed)
                if several:
                    positions = {**hub.positions, **reached}  # type: ignore[attr-defined]
                    yield sse("hello", {"stores": {n: _position_json(p) for n, p in positions.items()}})
                    for name, code in {**hub.down, **failed}.items():  # type: ignore[attr-defined]
                        yield sse("unavailable", {"store": name, "error": code})
                else:
                    position = reached.get("", hub.position)
                    yield sse("hello", _position_json(position))
                if hub.unavailable is not None:
                    yield sse("unavailable", {"error": hub.unavailable})
                elif hub.last_stats is not None:
                    yield sse("stats", hub.last_stats)
                while True:
                    if blind and answered_again(blind):
                        yield sse("reset", {"reason": "store_back"})
                        return
                    try:
                        item = await asyncio.wait_for(sub.queue.get(), KEEPALIVE_S)
                    except TimeoutError:
                        if hub.closed:
                            return
                        yield b": keep-alive\n\n"
                        continue
                    if item is None:
                        return
                    frame, key = item
                    if key is not None and key[0] in reached and key[1] <= reached[key[0]].revision:
                        continue  # replayed above
                    yield frame
            finally:
                hub.unsubscribe(sub)

        return StreamingResponse(stream(), media_type="text/event-stream", headers=headers)

    async def static(request: Request) -> Response:
        name = request.path_params["name"]
        media = STATIC.get(name)
        if media is None:
            return error(request, 404, "not_found", "no such static file")
        body = resources.files("fencepost.ui").joinpath("static", name).read_bytes()
        return Response(body, media_type=media, headers={"cache-control": "no-cache"})

    async def not_found(request: Request, exc: Exception) -> Response:
        return error(request, 404, "not_found", "no such page")

    async def method_not_allowed(request: Request, exc: Exception) -> Response:
        return error(request, 405, "read_only", "the console is read-only: only GET and HEAD are served")

    async def store_failure(request: Request, exc: Exception) -> Response:
        # The store refused or failed: a page naming the code and one line on stderr, not a
        # traceback per request. Its database out of reach (a server stopped, a file gone) is a
        # 503 that says so and reloads itself; a stored row it cannot read stays a 500. Anything
        # else is a bug: ``failure``.
        code = exc.code if isinstance(exc, FencepostError) else "internal_error"
        log.warning("console: the store could not answer a page (%s)", code)
        if isinstance(exc, FencepostError) and database_down(exc):
            response = error(request, 503, code, UNREACHABLE)
            response.headers["retry-after"] = str(RETRY_AFTER_S)
            return response
        return error(request, 500, code, "the store could not answer this page")

    async def failure(request: Request, exc: Exception) -> Response:
        return error(request, 500, "internal_error", "the store could not answer this page")

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await run_in_threadpool(hub.start)
        try:
            yield
        finally:
            await run_in_threadpool(hub.close)
            if owned:  # off the event loop, all at once: each waits for its open attempt in flight
                await asyncio.gather(*(run_in_threadpool(each.close) for each in named.values()))

    get = ["GET", "HEAD"]
    app = Starlette(
        routes=[
            Route("/", runs, methods=get),
            Route("/runs/{run_id:fencepost_any_text}", run, methods=get),
            Route("/journal", journal, methods=get),
            Route("/projections", projections, methods=get),
            Route("/health", health, methods=get),
            Route("/health.json", health_json, methods=get),
            Route("/events", events, methods=get),
            Route("/static/{name}", static, methods=get),
        ],
        exception_handlers={404: not_found, 405: method_not_allowed, FencepostError: store_failure,
                            Exception: failure},
        lifespan=lifespan,
    )
    app.state.hub = hub
    app.state.store = store
    app.state.stores = dict(named) if several else None
    app.add_middleware(Guard, templates=templates, allowed_hosts=allowed_hosts)
    return app
