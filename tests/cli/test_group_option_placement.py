"""``--db`` or ``--shards`` written after the command (``fencepost runs list --db URL``) says where
it goes.

Both are options of ``fencepost`` itself, so a command's ``--help`` does not list them and click
answered ``No such option '--db'``: a user who had just read ``--db`` in ``fencepost --help`` was
told it does not exist. The one line now says to give it before the command, spelled out for the
command typed. Refused while parsing, before any database is opened: no backend to run on. The
URL typed is not echoed (it may hold a password).
"""

from __future__ import annotations

import pytest

from tests.cli.conftest import assert_one_line_error

SECRET = "s3cret-pw"


@pytest.mark.parametrize(("args", "hint"), [
    (["runs", "list", "--db", f"postgresql://u:{SECRET}@h/db"], "fencepost --db URL runs list"),
    (["feed", "tail", "--follow", f"--db=sqlite:///{SECRET}.db"], "fencepost --db URL feed tail"),
    (["journal", "verify", "--shards", f"{SECRET}.txt"], "fencepost --shards FILE journal verify"),
], ids=["runs-list", "feed-tail-equals", "shards"])
def test_a_group_option_after_the_command_says_to_give_it_before(run_cli, args, hint):
    result = run_cli(*args)
    assert_one_line_error(result)
    assert result.code == 2, result
    assert "before the command" in result.err and hint in result.err, result
    assert SECRET not in result.err, result


def test_another_unknown_option_keeps_clicks_message(run_cli):
    result = run_cli("runs", "list", "--nope")
    assert_one_line_error(result)
    assert result.code == 2 and "No such option" in result.err and "before the command" not in result.err, result
