"""``RunStore.noop()``: the explicit absence of a run store (seed ``layerNoop``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fencepost.runstore import _checks as check
from fencepost.runstore._base import (
    CLAIM_LOST,
    MAXIMUM_RUN_JSON_DEPTH,
    MAXIMUM_RUN_JSON_NODES,
    NOT_FOUND,
)


def _failing(method: str) -> Callable[..., Any]:
    def fail(*_a: Any, **_k: Any) -> Any:
        raise check.refuse(method, "no run store is composed (noop)", {}, code="persistence_failed")
    return fail


def _answer(value: Any) -> Callable[..., Any]:
    return lambda *_a, **_k: value


class NoopRunStore:
    """The explicit absence of a run store; see ``RunStore.noop``."""

    MAXIMUM_RUN_JSON_DEPTH = MAXIMUM_RUN_JSON_DEPTH
    MAXIMUM_RUN_JSON_NODES = MAXIMUM_RUN_JSON_NODES
    _METHODS = (
        "create", "create_many", "retry", "delete", "get", "lineage", "latest_round", "request_cancel",
        "request_cancel_lineage",
        "acknowledge_cancel", "claim", "activate", "abandon_claim", "claim_and_own", "recover_claim",
        "steal", "heartbeat", "heartbeat_many", "reconfirm", "transition_owned",
    )

    def __init__(self, **overrides: Callable[..., Any]) -> None:
        for name in ("create", "create_many", "retry", "delete", "get", "lineage", "latest_round",
                     "request_cancel_lineage"):
            setattr(self, name, _failing(name))
        for name in ("request_cancel", "claim", "claim_and_own", "recover_claim", "steal", "heartbeat",
                     "reconfirm", "transition_owned"):
            setattr(self, name, _answer(NOT_FOUND))
        self.activate = _answer(CLAIM_LOST)
        self.abandon_claim = _answer(CLAIM_LOST)
        self.acknowledge_cancel = _answer(False)
        self.heartbeat_many = lambda owner, run_ids, now_ms: dict.fromkeys(run_ids, NOT_FOUND)
        for name, fn in overrides.items():
            if name not in self._METHODS:
                raise TypeError(f"RunStore.noop: unknown operation {name!r}")
            setattr(self, name, fn)
