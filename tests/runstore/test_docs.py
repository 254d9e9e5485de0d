"""The Python snippets of the run-store concept pages run as written."""

from __future__ import annotations

import re

import pytest

from tests._docs import DOCS, run_snippets


@pytest.mark.parametrize("page", ["fencing.md", "leases.md", "durable-values.md"])
def test_concept_page_snippets_run(page: str) -> None:
    run_snippets(DOCS / "concepts" / page, "runstore_doc")


# ------------------------------------------------- the pages' tables and lists, pinned to the code
def _table_rows(page: str) -> list[list[str]]:
    """The cells of every markdown table row of ``page`` (header and rule rows included)."""
    text = (DOCS / "concepts" / page).read_text(encoding="utf-8")
    return [[c.strip() for c in line.strip().strip("|").split("|")]
            for line in text.splitlines() if line.startswith("| ")]


def test_the_lease_durations_table_states_the_constants():
    from fencepost.runstore import heartbeat

    rows = {cells[0].strip("`"): cells[1] for cells in _table_rows("leases.md") if cells[0].startswith("`")}
    assert rows == {name: f"{int(getattr(heartbeat, name).total_seconds())} s" for name in heartbeat.__all__
                    if name.isupper()}


def test_the_outcomes_table_names_every_outcome_of_each_operation():
    """Each row of fencing.md "Outcomes by operation" lists exactly the members of that operation's
    union alias in ``fencepost.runstore.outcomes`` (a new outcome cannot go undocumented)."""
    from typing import get_args

    from fencepost.runstore import outcomes as o

    aliases = {"claim": o.ClaimOutcome, "claim_and_own": o.ClaimAndOwnOutcome, "activate": o.ActivateOutcome,
               "abandon_claim": o.AbandonClaimOutcome, "recover_claim": o.RecoverClaimOutcome,
               "steal": o.StealOutcome, "heartbeat": o.HeartbeatOutcome, "reconfirm": o.ReconfirmOutcome,
               "transition_owned": o.TransitionOutcome, "request_cancel": o.RequestCancelOutcome,
               "attempts.put": o.PutOutcome, "attempts.heartbeat": o.AttemptHeartbeatOutcome,
               "attempts.finish": o.FinishOutcome, "attempts.patch": o.PatchOutcome}
    documented: dict[str, set[str]] = {}
    for cells in _table_rows("fencing.md"):
        ops = re.findall(r"`([a-z_.]+)`", cells[0])
        if not ops or len(cells) != 2:
            continue
        names = set(re.findall(r"`([A-Z]\w*)", cells[1]))
        if cells[1].startswith("the `claim` outcomes and"):
            names |= documented["claim"]
        for op in ops:
            documented[op] = names
    for op, alias in aliases.items():
        assert documented.get(op) == {t.__name__ for t in get_args(alias)}, op


def test_the_run_store_error_codes_listed_are_the_codes_it_raises():
    from typing import get_args

    from fencepost.errors import RunStoreCode

    text = (DOCS / "concepts" / "fencing.md").read_text(encoding="utf-8")
    sentence = re.search(r"`RunStoreError` \(codes(.*?)\) is only", text, re.DOTALL)
    assert sentence is not None
    assert set(re.findall(r"`([a-z_]+)`", sentence.group(1))) - {"retry", "delete", "list_runs"} \
        == set(get_args(RunStoreCode))
