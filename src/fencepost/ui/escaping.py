"""How stored text reaches the console's HTML: escaped, shown as the CLI shows it, and with no raw
control character.

A run id may hold any character but NUL, a flow name or a host id any text. Whatever a page
carries of such text is written so that an HTML parser reads back exactly that text, and so that
the page's bytes hold no C0 control character but tab and line feed (nor DEL): such a character is
written as a numeric character reference (``&#27;``), which the HTML standard decodes to the
character itself (a carriage return written raw would even be read as a line feed). C1 controls
stay raw: the standard decodes ``&#128;`` ... ``&#159;`` as windows-1252 characters, so a reference
would not read back; raw, they are valid UTF-8 and read back exactly.
"""

from __future__ import annotations

import re
from xml.sax.saxutils import escape as xml_escape
from xml.sax.saxutils import quoteattr

from markupsafe import Markup, escape

from fencepost._printable import printable

_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f]")


def char_refs(html: str) -> str:
    """``html`` with each C0 control character but tab and line feed, and DEL, written as a numeric
    character reference."""
    return _CONTROLS.sub(lambda m: f"&#{ord(m.group())};", html)


def exact_attr(value: object) -> Markup:
    """``value`` escaped for an HTML attribute (the templates' ``exact_attr``) so that the page reads
    it back exactly, control characters included."""
    return Markup(char_refs(str(escape(value))))


def shown(value: object) -> object:
    """What a page shows of each value it renders (the templates' ``finalize``): stored text as
    ``fencepost runs list`` shows it, a bidi override, a zero-width space, a control character ...
    written ``\\u202e``, ``\\x1b``, so that a run id or a flow name never reorders the page around it
    nor passes for another. Line breaks and tabs stay (a carriage return as ``&#13;``). ``Markup``
    (an attribute ``exact_attr`` kept exact, the timeline's SVG) is the console's own and passes as
    it is."""
    if isinstance(value, str) and not isinstance(value, Markup):
        return Markup(char_refs(str(escape(printable(value)))))
    return value


def svg_text(value: str) -> str:
    """``value`` as the text of an SVG element the console draws: shown as ``shown`` shows it."""
    return char_refs(xml_escape(printable(value)))


def svg_attr(value: str) -> str:
    """``value`` quoted as an attribute of an SVG element the console draws: shown as ``shown``
    shows it."""
    return char_refs(quoteattr(printable(value)))
