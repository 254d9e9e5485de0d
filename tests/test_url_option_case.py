"""An unknown URL option whose name is not shown still reads as a sentence, and says what is wrong
when it is a known option written with capitals.

Defect (found by a review, both backends): ``?PASSWORD=x`` (PostgreSQL) and ``?Busy_Timeout_ms=5``
(SQLite) were refused as "unknown URL option an option (known: ...)": ungrammatical, and no hint
that option names are lowercase. A name that does not look like one (it may be a value put where a
name goes) is still never shown.
"""

from __future__ import annotations

import pytest

from fencepost._durable import parse_url


@pytest.mark.parametrize(("url", "named"), [
    ("sqlite:////tmp/x.db?Busy_Timeout_ms=5", "'busy_timeout_ms' written with capitals"),
    ("postgresql+psycopg://u@h/db?PASSWORD=SECRET-XYZ", "'password' written with capitals"),
    ("postgresql+psycopg://u@h/db?Schema=abc", "'schema' written with capitals"),
])
def test_a_known_option_written_with_capitals_is_named_in_lowercase(url: str, named: str) -> None:
    with pytest.raises(ValueError) as caught:
        parse_url(url)
    message = str(caught.value)
    assert message.startswith(f"unknown URL option {named} (option names are lowercase)"), message
    assert "SECRET-XYZ" not in message and "an option" not in message


@pytest.mark.parametrize("url", ["sqlite:////tmp/x.db?SECRET-XYZ=1", "postgresql+psycopg://u@h/db?Sekret%20XYZ=1"])
def test_a_name_that_does_not_look_like_one_is_not_shown(url: str) -> None:
    with pytest.raises(ValueError) as caught:
        parse_url(url)
    message = str(caught.value)
    assert message.startswith("unknown URL option whose name is not shown"), message
    assert "XYZ" not in message and "an option (" not in message
