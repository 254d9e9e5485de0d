"""How text a store holds is shown on a terminal or a page: as it was stored, with nothing hidden,
acted on or passed off as something else. The CLI's tables and messages and the web console's pages
both show stored text (a run id, a flow name, a failure message) through these two functions, so
the two always show it alike.
"""

from __future__ import annotations

# Characters never shown as themselves: every one Python does not call printable. Controls
# (Cc) a terminal acts on; invisible format characters (Cf: the bidirectional overrides and isolates,
# zero-width spaces and joiners, the byte order mark, the soft hyphen ...) that reorder or hide the
# text around them; the Unicode line and paragraph separators (Zl, Zp); every space but U+0020 (Zs:
# U+3000, U+00A0, U+2007 look like the space of another id); private-use (Co) and unassigned (Cn)
# code points, drawn as blanks, boxes or whatever a font puts there; and lone surrogates (Cs: a byte
# decoded with surrogateescape), which a UTF-8 terminal cannot even be sent. Tab, newline and carriage
# return stay in free text (a table or a page handles those).
_KEPT = frozenset("\t\n\r")


def printable(text: str) -> str:
    """``text`` for a terminal, as the store holds it but with nothing hidden, acted on or passed off
    as something else: every control character (``ESC``, ``BEL``, the C1 ``CSI`` ...), invisible
    format character (``U+202E`` RIGHT-TO-LEFT OVERRIDE, ``U+200B`` ZERO WIDTH SPACE ...), space other
    than U+0020 (``U+3000``, ``U+00A0`` ...), private-use, unassigned or surrogate code point written
    as ``\\xNN``, ``\\uNNNN`` or ``\\UNNNNNNNN``, so text a store holds (a run id, a flow name, a
    failure message) never clears a screen, sets a window title or shows as another run's id. Tab and
    line ends stay; so does a backslash (``one_line`` escapes it in an identifier)."""
    if text.isprintable():  # the usual case: nothing Python calls unprintable
        return text
    return "".join(ch if ch.isprintable() or ch in _KEPT else _escaped(ch) for ch in text)


def one_line(text: str) -> str:
    """``printable(text)`` with tab and line ends escaped too (``\\x09``, ``\\x0a``, ``\\x0d``), and a
    backslash written ``\\\\``: for an identifier, which a table shows on one line. Joined with a space,
    ``order<LF>17`` would show as ``order 17``, another run's id; a tab would look like the gap between
    two columns; an id holding the four characters ``\\x1b`` would read as one holding ESC, escaped."""
    if text.isprintable() and "\\" not in text:
        return text
    return "".join("\\\\" if ch == "\\" else ch if ch.isprintable() else _escaped(ch) for ch in text)


def _escaped(ch: str) -> str:
    code = ord(ch)
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"
