"""``fencepost ui``: serve the read-only live web console (needs the ``fencepost[ui]`` extra)."""

from __future__ import annotations

import signal

import click

from fencepost.cli._common import INTERRUPTED, CliContext, _checked_url, err_console, not_utf8


def _checked_db(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """``--db`` is checked as the global ``--db`` is: a bad URL is a usage error, before anything opens."""
    return None if value is None else _checked_url(value, "--db")


def _checked_host(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """An empty or blank ``--host`` (``--host "$HOST"`` with ``HOST`` unset) would listen on every
    interface: refused, so exposing the console always takes an address typed on purpose."""
    if not value.strip():
        raise click.UsageError("--host: must not be empty or blank (0.0.0.0 listens on every interface)")
    if not_utf8(value):
        raise click.UsageError("--host: must be UTF-8 text (it holds bytes that are not)")
    return value


def _bind_failure(exc: OSError, host: str, port: int) -> str:
    """One line saying which address could not be listened on and which option to change."""
    import errno
    import socket

    why = exc.strerror or "bind failed"
    if isinstance(exc, socket.gaierror):
        return f"--host {host!r}: not an address or host name to listen on ({why})"
    bare = host.strip("[]")
    address = f"[{bare}]:{port}" if ":" in bare else f"{bare}:{port}"
    if exc.errno == errno.EADDRINUSE:
        return (f"cannot listen on {address}: the port is in use (another console?); "
                "give another --port, or --port 0 for any free one")
    return f"cannot listen on {address} ({why}): check --host and --port"


@click.command()
@click.option("--db", "db", metavar="URL", default=None, callback=_checked_db,
              help="Database URL to serve (the same as the global --db; default: $FENCEPOST_DB, "
                   "else sqlite:///.flows/flows.db). For several stores give the global --db (repeated) "
                   "or --shards before ui.")
@click.option("--host", default="127.0.0.1", show_default=True, callback=_checked_host,
              help="Address to listen on. Anything but loopback exposes every run to the network (with a warning).")
@click.option("--port", default=8765, show_default=True, type=click.IntRange(0, 65535),
              help="Port to listen on (0: any free port).")
@click.option("--open", "open_browser", is_flag=True, help="Open the console in the default web browser.")
@click.pass_obj
def ui(obj: CliContext, db: str | None, host: str, port: int, open_browser: bool) -> None:
    """Serve a read-only live web console: runs, one run's ownership timeline, journal, projections, health.

    The database is opened read-only; no page writes. Pages update live from one change-feed
    follower shared by every open tab. Stop with Ctrl-C.

    Across several stores (the global --db repeated, or --shards) it serves one console over all of
    them: the runs listing merged and labelled with each run's store, a run's page at
    /runs/STORE/RUN_ID, and a section per store on the journal, projections and health pages.

    Example: fencepost ui --db sqlite:///.flows/flows.db --open
    """
    from fencepost.ui import missing_extra

    missing = missing_extra()
    if missing:
        raise click.ClickException(
            f"fencepost ui needs the 'ui' extra ({', '.join(missing)} missing): pip install 'fencepost[ui]'"
        )
    from fencepost._durable import redact_url
    from fencepost.ui.app import LOOPBACK_NAMES, create_app, is_loopback
    from fencepost.ui.awaited import awaiting, open_or_await
    from fencepost.ui.server import bind, serve, url_of

    if db is not None:
        obj.url = db
    # A store whose server does not answer yet is served as down and picked up once it answers;
    # one that can never open (a missing SQLite file, refused credentials ...) stops the command here.
    stores = obj.stores(readonly=True, opener=open_or_await) if obj.several else None
    store = obj.store(readonly=True, opener=open_or_await) if stores is None else None
    try:
        sock = bind(host, port)
    except OSError as exc:
        raise click.ClickException(_bind_failure(exc, host, port)) from None
    # On loopback, answer only to loopback names (a DNS-rebinding page names its own host); exposed,
    # the names a client may use are unknown here, so any is answered.
    allowed = LOOPBACK_NAMES if is_loopback(host) else None
    if not is_loopback(host):
        # One line on a pipe or a file, as the demo's lines are (wrapped to the width on a terminal).
        err_console.print("[yellow]warning[/yellow]: listening on a non-loopback address: anyone who can reach "
                          "it can read every run (the console is read-only and redacts secrets, but has no login)",
                          soft_wrap=not err_console.is_terminal)
    url = url_of(sock)
    if stores is None:
        served = redact_url(obj.resolved_url)
    else:
        served = f"{len(stores)} stores (" + ", ".join(f"{n}={redact_url(s.url)}" for n, s in stores.items()) + ")"
    click.echo(f"fencepost console for {served} at {url}  (read-only; Ctrl-C to stop)")
    for name, each in (stores or {"": store}).items():
        if awaiting(each):
            which = f"store {name}" if name else "the database"
            err_console.print(f"[yellow]warning[/yellow]: {which} does not answer ({each.error.code}): "
                              "served as down until it answers", soft_wrap=not err_console.is_terminal,
                              markup=True, highlight=False)
    if open_browser:
        import webbrowser

        try:
            opened = webbrowser.open(url)
        except Exception:  # a broken $BROWSER setting, say: the console serves on regardless
            opened = False
        if not opened:
            from rich.markup import escape

            err_console.print("[yellow]warning[/yellow]: --open: no web browser could be started here; "
                              f"open {escape(url)} yourself",
                              soft_wrap=not err_console.is_terminal, markup=True, highlight=False)
    app = create_app(store=store, allowed_hosts=allowed) if stores is None else create_app(
        stores=stores, allowed_hosts=allowed)
    if serve(app, sock) == signal.SIGINT:
        raise SystemExit(INTERRUPTED)
