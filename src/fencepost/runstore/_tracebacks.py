"""The traceback a log line may carry: an exception's, redacted as a failed run's stored failure is.

The worker logs a failed run's traceback, and a supervisor a failing callback's, through
``logged_traceback``: one redaction path, so a log never shows what ``runs show`` hides.
"""

from __future__ import annotations

from typing import Any

from fencepost.journal.redaction import DEFAULT, redact_diagnostics
from fencepost.runstore.rows import RunFailure


def store_redaction(store: Any, run_id: str) -> Any:
    """The redaction ``store`` applies to ``run_id``'s failure (its shard's, in a shard set); the
    default rules when it cannot be found."""
    store_for = getattr(store, "store_for", None)
    try:
        return (store_for(run_id) if store_for is not None else store).journal.redaction
    except Exception:  # locating the run's shard failed: the default rules still apply
        return DEFAULT


def logged_traceback(exc: BaseException, redaction: Any, failure: RunFailure | None = None) -> str:
    """``exc``'s traceback for a log line: frames and every message (chained causes too) redacted as
    a run's stored failure is (``failure``, a ``RunFailure`` already made from ``exc``, saves making
    it again), so the log shows what ``runs show`` prints.

    Log it as text, never as the exception: a handler that formats ``exc_info`` itself, or keeps
    frame locals, would print each message verbatim. ``redaction`` (the store's, see
    ``store_redaction``) comes first; when it fails, the default rules; when they fail too, the
    traceback is withheld and only the type is logged. ``Redaction.noop()`` is the store's explicit
    opt-out: the traceback is logged as given.
    """
    if failure is None:
        try:
            failure = RunFailure.from_exception(exc)
        except Exception:  # logging a failure must never raise one
            return f"{type(exc).__name__} (traceback withheld: it could not be formatted)"
    fields = {"type": failure.type, "message": failure.message, "traceback": failure.traceback}
    for candidate in (redaction, DEFAULT):
        if not getattr(candidate, "enabled", True):
            return failure.bounded().traceback
        try:
            text = redact_diagnostics(candidate, fields)["traceback"]
        except Exception:  # the redactor's own error may quote the text: never pass it on
            continue
        if type(text) is str:  # redacted, then cut as the store cuts it
            return RunFailure(failure.type, "", text).bounded().traceback
    return f"{failure.type} (traceback withheld: it could not be redacted)"
