"""The run store's durable shapes: rows, snapshots, evidence, attempts and the attempt policy.

All are frozen msgspec Structs. They are built by callers without validation (msgspec does not
check types at construction), so every store operation validates what it is handed before it
writes, and every row read back from the database is decoded strictly (``decode_failed``).
"""

from __future__ import annotations

import traceback as _tb
from typing import Any, ClassVar, Literal

import msgspec

from fencepost.journal.owner import OwnerId

RunStatus = Literal["pending", "running", "suspended", "completed", "failed", "cancelled"]
STATUSES = frozenset({"pending", "running", "suspended", "completed", "failed", "cancelled"})
TERMINAL = frozenset({"completed", "failed", "cancelled"})

EvidenceKind = Literal["same-host-pid-dead", "cross-host-unreachable-stale", "lease-expired"]
EVIDENCE_KINDS = frozenset({"same-host-pid-dead", "cross-host-unreachable-stale", "lease-expired"})


class RunSnapshot(msgspec.Struct, frozen=True):
    """The exact triple a claim guards: ``status``, ``owner`` and ``heartbeat_at_ms``.

    ``running`` requires an owner and a heartbeat; every other status requires neither.
    """

    status: str
    owner: OwnerId | None
    heartbeat_at_ms: int | None


class RunFailure(msgspec.Struct, frozen=True):
    """Why a run failed, recorded with its ``failed`` settlement.

    ``type`` is the exception's class name (qualified by its module unless built in), ``message``
    its text and ``traceback`` the formatted traceback, its last ``MAX_TRACEBACK`` characters when
    longer. The store redacts all three with the journal's redaction before it writes them, so a
    credential in an exception message never lands verbatim.
    """

    type: str
    message: str
    traceback: str

    MAX_TYPE: ClassVar[int] = 200
    MAX_MESSAGE: ClassVar[int] = 2000
    MAX_TRACEBACK: ClassVar[int] = 8000

    @classmethod
    def from_exception(cls, exc: BaseException) -> RunFailure:
        """Describe ``exc`` (with its traceback), each part cut far past the limits above.

        The store redacts a failure before it cuts it to the limits (``bounded``): a cut landing
        inside a secret would take away what makes it recognisable (the ``@host`` after a URL's
        password, the start of ``password=``). This first cut, ``_SLACK`` times the limits, only
        bounds the redaction's work: a secret it splits lies so far past the final cut that nothing
        of it is kept. Redact before showing the result anywhere else (``bounded`` after)."""
        t = type(exc)
        name = t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"
        try:
            message = str(exc)
        except Exception:  # a broken __str__ must not hide the failure itself
            message = "<the exception's message could not be read>"
        te = _tb.TracebackException.from_exception(exc)
        whole = "".join(te.format())
        last = "".join(te.format_exception_only())
        frames = whole[: len(whole) - len(last)] if whole.endswith(last) else whole
        last = _head(last.rstrip("\n"), (cls.MAX_MESSAGE + cls.MAX_TYPE) * _SLACK) + "\n"
        text = _tail(frames, max(0, cls.MAX_TRACEBACK * _SLACK - len(last))) + last
        return cls(_durable_text(_head(name, cls.MAX_TYPE * _SLACK)),
                   _durable_text(_head(message, cls.MAX_MESSAGE * _SLACK)), _durable_text(text))

    def bounded(self) -> RunFailure:
        """The same failure cut to the limits: the type and message keep their start, the traceback
        its end. The traceback's final ``Type: message`` lines repeat the message: they are cut like
        the message first, so a huge message cannot push the frames (where it was raised) out."""
        traceback = self.traceback
        if len(traceback) > self.MAX_TRACEBACK:
            at = traceback.rfind("\n" + self.type) + 1 if self.type else 0
            if at > 0:
                last = _head(traceback[at:].rstrip("\n"), self.MAX_MESSAGE + self.MAX_TYPE) + "\n"
                traceback = _tail(traceback[:at], max(0, self.MAX_TRACEBACK - len(last))) + last
        return RunFailure(_head(self.type, self.MAX_TYPE), _head(self.message, self.MAX_MESSAGE),
                          _tail(traceback, self.MAX_TRACEBACK))


_CUT = "..."
#: How far past the limits ``from_exception`` cuts (the store redacts, then cuts to the limits).
_SLACK = 16


def _durable_text(text: str) -> str:
    # What a durable string cannot hold (NUL, a lone surrogate) is written as an escape instead.
    return text.replace("\x00", "\\x00").encode("utf-8", "backslashreplace").decode("utf-8")


def _head(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - len(_CUT)] + _CUT


def _tail(text: str, limit: int) -> str:
    return text if len(text) <= limit else _CUT + text[len(text) - limit + len(_CUT):]


class RunRow(msgspec.Struct, frozen=True):
    """One ``flows_runs`` row, decoded and re-validated. ``failure`` is set only on a ``failed`` run
    settled with a recorded reason (see ``RunFailure``)."""

    run_id: str
    status: str
    state_json: str
    created_at_ms: int
    started_at_ms: int | None
    finished_at_ms: int | None
    heartbeat_at_ms: int | None
    owner: OwnerId | None
    claimant: OwnerId | None
    claimed_at_ms: int | None
    cancel_requested_at_ms: int | None
    cancel_acknowledgement: dict[str, Any] | None
    parent_run_id: str | None
    lineage_id: str | None
    round_ordinal: int | None
    failure: RunFailure | None = None

    def snapshot(self) -> RunSnapshot:
        """The three guarded fields, to hand back as ``expected``."""
        return RunSnapshot(self.status, self.owner, self.heartbeat_at_ms)


class LivenessEvidence(msgspec.Struct, frozen=True):
    """A claim about the recorded owner the store checks before it admits a takeover.

    ``checked_at_ms`` must equal the consuming call's ``now_ms`` exactly. ``kind`` is
    ``same-host-pid-dead`` (observer and owner share a host), ``cross-host-unreachable-stale``
    (the hosts differ) or ``lease-expired`` (any host; the store verifies the stale lease itself).
    """

    expected_owner: OwnerId
    checked_at_ms: int
    kind: str


class LivenessContext(msgspec.Struct, frozen=True):
    """What a liveness check is asked against: the claimant, the persisted heartbeat and the instant."""

    claimant: OwnerId
    heartbeat_at_ms: int | None
    now_ms: int


class Attempt(msgspec.Struct, frozen=True):
    """One step attempt of a run. ``None`` in an optional field means absent (no column value)."""

    run_id: str
    step_key_digest: str
    attempt: int
    state: str
    started_at_ms: int
    finished_at_ms: int | None = None
    heartbeat_at_ms: int | None = None
    checkpoint: Any = None
    error: Any = None
    outcome: Any = None
    meta: Any = msgspec.field(default_factory=dict)


class AttemptPolicy(msgspec.Struct, frozen=True):
    """How an attempt store judges attempts; validated when the store is built.

    ``in_progress_states``: unique durable identifiers meaning "still moving" (``heartbeat`` and
    ``finish`` fence on membership). ``max_checkpoint_bytes``: 1 ..= 16 MiB (UTF-8 bytes of the
    encoded checkpoint). ``put_mode``: ``insert`` (first writer wins) or ``upsert`` (a re-put
    overwrites an attempt that is still in progress).
    """

    in_progress_states: tuple[str, ...] = ("running",)
    max_checkpoint_bytes: int = 1024 * 1024
    put_mode: str = "insert"


__all__ = [
    "Attempt",
    "AttemptPolicy",
    "LivenessContext",
    "LivenessEvidence",
    "RunFailure",
    "RunRow",
    "RunSnapshot",
]
