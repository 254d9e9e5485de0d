"""The ownership timeline of one run, drawn on the server as SVG.

One lane per owner that appears in the run's ownership facts, time running left to right. On a
lane: the tenure bars journal replay rebuilt (``activated`` to the fact that ended it), a marker per
fact (claim, activation, steal, expiry, release), hatched heartbeat gaps (the last 30 s of a tenure
that ended in a steal, when the lease was stale; a journaled ``lease-reconfirmed`` gap; a running
owner's silence since its last heartbeat), dashed takeover lines from the displaced owner to the
stealer, and the settlement line. Replay's violations are marked in red on the axis.

Every text that reaches the SVG is escaped here (``escaping.svg_text``); the result is a complete
``<svg>`` element.
"""

from __future__ import annotations

from typing import Any

from fencepost.journal.owner import OwnerId
from fencepost.journal.replay import STALE_AFTER_MS, owner_of
from fencepost.ui.escaping import svg_attr, svg_text

WIDTH = 960
LABEL_W = 200
RIGHT_PAD = 24
AXIS_H = 34
LANE_H = 36
BAR_H = 14
#: A running owner silent for longer than this is drawn with a heartbeat gap up to now.
SILENT_AFTER_MS = 5_000
_PREFIX = "flows.consensus."


def _key(owner: Any) -> tuple[str, int, str] | None:
    """The lane of an owner: a fact's ``owner`` member (a dict) or a replayed ``OwnerId``; None for
    anything else (a fact edited by hand to hold a string, a list ...: replay reports it)."""
    if isinstance(owner, OwnerId):
        return (owner.host_id, owner.pid, owner.nonce)
    owner = owner_of(owner)
    return None if owner is None else (owner.host_id, owner.pid, owner.nonce)


def _label(key: tuple[str, int, str]) -> str:
    from fencepost._printable import printable

    return printable(f"{key[0]}/{key[1]}/{key[2][:8]}")  # a host id is text a worker chose


def _fmt_span(ms: float) -> str:
    if abs(ms) < 2000:
        return f"+{ms:.0f} ms"
    s = ms / 1000
    if abs(s) < 120:
        return f"+{s:.1f} s"
    return f"+{s / 60:.1f} min"


def render_timeline(row: Any, facts: list[Any], history: Any, warnings: list[Any], now_ms: int, *,
                    bounded: bool = False) -> str:
    """The SVG of ``row``'s ownership: ``facts`` are its companion-stream entries, ``history`` its replay.

    ``bounded``: ``facts`` are the newest of more (and ``history`` holds what is drawn of them):
    the axis starts at the oldest fact shown, and says so."""
    lanes: list[tuple[str, int, str]] = []
    for e in facts:
        k = _key(e.payload.get("owner") if isinstance(e.payload, dict) else None)
        if k is not None and k not in lanes:
            lanes.append(k)
    for i in history.intervals:
        k = _key(i.owner)
        if k not in lanes and k is not None:
            lanes.append(k)

    # The axis spans the ownership facts (and, for a running run, up to now); a run created long
    # before its first claim would otherwise squeeze every tenure into the right edge.
    times = [e.emitted_at_ms for e in facts] or [row.created_at_ms]
    times += [t for t in (row.finished_at_ms, row.heartbeat_at_ms) if t is not None]
    running = row.status == "running"
    if running:
        times.append(now_ms)
    t0, t1 = min(times), max(times)
    if t1 <= t0:
        t1 = t0 + 1000
    origin = t0
    pad = (t1 - t0) * 0.03
    t0, t1 = t0 - pad, t1 + pad
    plot_w = WIDTH - LABEL_W - RIGHT_PAD
    height = AXIS_H + max(1, len(lanes)) * LANE_H + 30

    def x(t: float) -> float:
        return round(LABEL_W + (min(max(t, t0), t1) - t0) / (t1 - t0) * plot_w, 1)

    def lane_y(k: tuple[str, int, str]) -> float:
        return AXIS_H + lanes.index(k) * LANE_H + LANE_H / 2

    out: list[str] = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="timeline" data-lanes="{len(lanes)}" '
        f'viewBox="0 0 {WIDTH} {height}" preserveAspectRatio="xMinYMin meet" role="img" '
        f'aria-label={svg_attr(f"ownership timeline of {row.run_id}: {len(lanes)} owner(s)")}>',
        '<defs><pattern id="gap-hatch" patternUnits="userSpaceOnUse" width="6" height="6" '
        'patternTransform="rotate(45)"><rect width="6" height="6" fill="#fff4e0"/>'
        '<line x1="0" y1="0" x2="0" y2="6" stroke="#e08a00" stroke-width="2"/></pattern></defs>',
    ]
    # Axis: start stamp and relative ticks.
    out.append(f'<g class="axis"><line x1="{LABEL_W}" y1="{AXIS_H - 8}" x2="{WIDTH - RIGHT_PAD}" '
               f'y2="{AXIS_H - 8}" stroke="#888"/>')
    for n in range(6):
        t = origin + (t1 - pad - origin) * n / 5
        tx = x(t)
        out.append(f'<line x1="{tx}" y1="{AXIS_H - 12}" x2="{tx}" y2="{height - 24}" stroke="#eee"/>')
        anchor = "start" if n == 0 else ("end" if n == 5 else "middle")
        out.append(f'<text x="{tx}" y="{AXIS_H - 16}" font-size="11" text-anchor="{anchor}" fill="#555">'
                   f'{svg_text(_fmt_span(t - origin))}</text>')
    first = ("the oldest ownership fact shown" if bounded else "the first ownership fact") if facts else "creation"
    before = f"; created {_fmt_span(origin - row.created_at_ms)[1:]} earlier" if origin > row.created_at_ms else ""
    out.append(f'<text x="8" y="{height - 10}" font-size="11" fill="#555">+0 = {svg_text(first)}{svg_text(before)}'
               '</text>')
    out.append('</g>')

    if not lanes:
        out.append(f'<text x="{LABEL_W}" y="{AXIS_H + LANE_H / 2 + 4}" font-size="13" fill="#666">'
                   'no owner yet: the run was never claimed</text>')

    ends: dict[tuple[str, int, str], list[Any]] = {k: [] for k in lanes}
    for i in history.intervals:
        k = _key(i.owner)
        if k in ends:
            ends[k].append(i)
    steals = [e for e in facts if e.event_type == _PREFIX + "stolen"]
    for k in lanes:
        y = lane_y(k)
        out.append(f'<g class="lane" data-owner={svg_attr(_label(k))}>')
        out.append(f'<text x="8" y="{y + 4}" font-size="12" font-family="monospace" fill="#222">'
                   f'{svg_text(_label(k))}</text>')
        out.append(f'<line x1="{LABEL_W}" y1="{y}" x2="{WIDTH - RIGHT_PAD}" y2="{y}" stroke="#ddd"/>')
        for i in ends[k]:
            held = running and i.ended_at_ms is None and _key(row.owner) == k
            end = i.ended_at_ms if i.ended_at_ms is not None else (now_ms if held else t1)
            cls = f"tenure ended-{i.ended_by or 'open'}"
            x0, x1 = x(i.started_at_ms), x(end)
            out.append(f'<rect class={svg_attr(cls)} x="{x0}" y="{y - BAR_H / 2}" width="{max(2.0, x1 - x0)}" '
                       f'height="{BAR_H}" rx="3"><title>{svg_text(_label(k))} owned the run from seq {i.start_seq}'
                       f'{" to seq " + str(i.end_seq) if i.end_seq is not None else ", still held"}'
                       f' ({svg_text(i.ended_by or "open")})</title></rect>')
            if i.ended_by == "stolen" and i.ended_at_ms is not None:
                g0 = max(i.started_at_ms, i.ended_at_ms - STALE_AFTER_MS)
                out.append(_gap(x(g0), x(i.ended_at_ms), y, "heartbeat gap: the lease was stale "
                                f"(no heartbeat for over {STALE_AFTER_MS // 1000} s) when it was stolen"))
            if held and row.heartbeat_at_ms is not None and now_ms - row.heartbeat_at_ms > SILENT_AFTER_MS:
                out.append(_gap(x(row.heartbeat_at_ms), x(now_ms), y,
                                f"no heartbeat for {(now_ms - row.heartbeat_at_ms) / 1000:.1f} s"))
        for w in warnings:
            if any(i.started_at_ms <= w.occurred_at_ms <= (i.ended_at_ms or t1) for i in ends[k]):
                out.append(_gap(x(w.occurred_at_ms - w.unconfirmed_ms), x(w.occurred_at_ms), y,
                                f"heartbeat gap: worked {w.unconfirmed_ms} ms unconfirmed, then reconfirmed"))
        for e in facts:
            if _key(e.payload.get("owner") if isinstance(e.payload, dict) else None) == k:
                out.append(_marker(e, x(e.emitted_at_ms), y))
        out.append('</g>')
    for e in steals:
        new = _key(e.payload.get("owner") if isinstance(e.payload, dict) else None)
        old = next((_key(i.owner) for i in history.intervals if i.end_seq is not None
                    and i.ended_by == "stolen" and _key(i.owner) != new and i.end_position is not None
                    and i.end_position > e.position), None)
        if new in lanes and old in lanes:
            sx = x(e.emitted_at_ms)
            out.append(f'<line class="takeover" x1="{sx}" y1="{lane_y(old)}" x2="{sx}" y2="{lane_y(new)}" '
                       f'stroke="#c0392b" stroke-dasharray="4 3" stroke-width="1.5"><title>takeover: '
                       f'{svg_text(_label(new))} stole the run from {svg_text(_label(old))}</title></line>')
    if row.finished_at_ms is not None:
        fx = x(row.finished_at_ms)
        out.append(f'<g class="settlement"><line x1="{fx}" y1="{AXIS_H - 8}" x2="{fx}" y2="{height - 24}" '
                   f'stroke="#333" stroke-width="2"/><text x="{fx}" y="{height - 10}" font-size="12" '
                   f'text-anchor="end" fill="#333">settled {svg_text(row.status)}</text></g>')
    by_seq = {e.seq: e for e in facts}
    for v in history.violations:
        e = by_seq.get(v.seq)
        vx = x(e.emitted_at_ms) if e is not None else LABEL_W
        out.append(f'<g class="violation"><circle cx="{vx}" cy="{AXIS_H - 8}" r="6" fill="#c0392b"/>'
                   f'<title>violation {svg_text(v.rule)} {v.where}: {svg_text(v.detail)}</title></g>')
    out.append('</svg>')
    return "".join(out)


def _gap(x0: float, x1: float, y: float, title: str) -> str:
    # A hatched band just under the tenure bar, so the bar itself stays visible.
    return (f'<rect class="gap" x="{x0}" y="{y + BAR_H / 2 + 1}" width="{max(2.0, x1 - x0)}" '
            f'height="7" fill="url(#gap-hatch)" stroke="#e08a00" stroke-width="0.5">'
            f'<title>{svg_text(title)}</title></rect>')


_SHAPES = {
    "claimed": ("circle", "#fff", "#2c3e50", "claimed"),
    "activated": ("circle", "#2c3e50", "#2c3e50", "activated"),
    "stolen": ("diamond", "#c0392b", "#c0392b", "stole the run"),
    "expired": ("cross", "#7f8c8d", "#7f8c8d", "claim expired"),
    "released": ("square", "#fff", "#27ae60", "released"),
}


def _marker(e: Any, mx: float, y: float) -> str:
    kind = e.event_type[len(_PREFIX):]
    shape, fill, stroke, what = _SHAPES.get(kind, ("circle", "#ccc", "#999", kind))
    title = f"<title>{svg_text(what)} at seq {e.seq} (position {e.position})</title>"
    cls = svg_attr(f"fact fact-{kind}")
    if shape == "circle":
        return (f'<circle class={cls} cx="{mx}" cy="{y}" r="5" fill="{fill}" stroke="{stroke}" stroke-width="2">'
                f'{title}</circle>')
    if shape == "square":
        return (f'<rect class={cls} x="{mx - 5}" y="{y - 5}" width="10" height="10" fill="{fill}" stroke="{stroke}" '
                f'stroke-width="2">{title}</rect>')
    if shape == "diamond":
        pts = f"{mx},{y - 7} {mx + 7},{y} {mx},{y + 7} {mx - 7},{y}"
        return f'<polygon class={cls} points="{pts}" fill="{fill}" stroke="{stroke}">{title}</polygon>'
    return (f'<path class={cls} d="M{mx - 5},{y - 5} L{mx + 5},{y + 5} M{mx - 5},{y + 5} L{mx + 5},{y - 5}" '
            f'stroke="{stroke}" stroke-width="2">{title}</path>')
