"""``fencepost.open()`` without a URL says that the URL it refused came from ``$FENCEPOST_DB``.

Defect: with no URL given, a bad ``$FENCEPOST_DB`` (``flows.db`` without a scheme, a port out of
range) raised the URL rule alone, and a store that could not be opened at it (nothing listening,
no database there) an ``OpenError`` naming the place alone: a library user who never passed a URL
could not tell where it came from, while the CLI says ``$FENCEPOST_DB: ...``. Both now say so,
still naming rules and masked places, never the password. Both backends; nothing is created.
"""

from __future__ import annotations

import os

import pytest

import fencepost
from fencepost import OpenError
from tests.conftest import store_exists

SECRET = "s3cr3t-pw"
BAD_URLS = {
    "sqlite": ["flows.db", "sqlite:///flows.db?busy_timeout_ms=-1"],
    "postgresql": [f"postgresql+psycopg://u:{SECRET}@127.0.0.1:99999/db",
                   f"postgresql+psycopg://u:{SECRET}@127.0.0.1:abc/db"],
}


@pytest.fixture
def cwd(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("readonly", [False, True])
def test_a_bad_url_in_the_environment_is_a_value_error_naming_the_variable(backend, cwd, monkeypatch, readonly):
    for url in BAD_URLS[backend]:
        monkeypatch.setenv("FENCEPOST_DB", url)
        with pytest.raises(ValueError) as err:
            fencepost.open(readonly=readonly)
        assert str(err.value).startswith("$FENCEPOST_DB: "), err.value
        assert SECRET not in str(err.value)
    assert os.listdir(cwd) == []


def test_a_bad_url_given_is_not_said_to_come_from_the_environment(backend, cwd, monkeypatch):
    monkeypatch.setenv("FENCEPOST_DB", "sqlite:///unused.db")
    for url in BAD_URLS[backend]:
        with pytest.raises(ValueError) as err:
            fencepost.open(url)
        assert "FENCEPOST_DB" not in str(err.value)
    assert os.listdir(cwd) == []


def test_a_store_not_opened_at_the_environment_url_says_where_the_url_came_from(db_url, cwd, monkeypatch):
    monkeypatch.setenv("FENCEPOST_DB", db_url)
    with pytest.raises(OpenError) as err:
        fencepost.open(readonly=True)  # nothing there yet
    assert err.value.code == "database_missing", err.value
    assert str(err.value).endswith("(the URL from $FENCEPOST_DB)"), err.value
    assert err.value.detail.endswith("(the URL from $FENCEPOST_DB)")
    assert not store_exists(db_url)
    with pytest.raises(OpenError) as given:
        fencepost.open(db_url, readonly=True)
    assert "FENCEPOST_DB" not in str(given.value)
