"""``fencepost ui``: a read-only live web console over one store or several (the ``fencepost[ui]`` extra).

Pages: Runs (listing, filters, newest first, rows updated live), a run (state, history, attempts,
lineage, the ownership timeline as SVG beside journal replay's verdict), Journal (hash-chain
verification, latest entries per stream), Projections (position, live lag, rebuilds) and Health
(feed position, source, writes/s, the oldest running heartbeat). One change-feed follower per
process feeds every open page through Server-Sent Events.

``create_app(url)`` builds the ASGI app (Starlette); ``create_app({name: url, ...})`` or
``create_app(stores=...)`` (a mapping of read-only stores, or a read-only ``ShardSet``) serves several
stores in one console. ``fencepost.ui.server`` serves it with uvicorn.
Importing this package needs none of the extra; ``create_app`` does.
"""

from __future__ import annotations

from typing import Any

EXTRA_MODULES = ("starlette", "uvicorn", "jinja2")


def missing_extra() -> list[str]:
    """The modules of the ``ui`` extra that are not importable here (empty when all are)."""
    import importlib

    missing = []
    for name in EXTRA_MODULES:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    return missing


def create_app(url: Any = None, **kwargs: Any) -> Any:
    """The console's Starlette app for ``url`` (or a mapping of names to URLs), opened read-only (see ``.app``)."""
    from fencepost.ui.app import create_app as build

    return build(url, **kwargs)


__all__ = ["create_app", "missing_extra"]
