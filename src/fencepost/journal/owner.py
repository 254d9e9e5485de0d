"""The fence: an owner identity, compared as the whole triple (seed fencing.md)."""

from __future__ import annotations

import msgspec

from fencepost._values import identifier_problem, is_safe_int


class OwnerId(msgspec.Struct, frozen=True):
    """``host_id`` names the machine, ``pid`` the process, ``nonce`` one incarnation of it."""

    host_id: str
    pid: int
    nonce: str

    def to_json(self) -> dict[str, object]:
        """The upstream wire shape ``{hostId, pid, nonce}`` used in journal facts."""
        return {"hostId": self.host_id, "pid": self.pid, "nonce": self.nonce}


def owner_problem(owner: object) -> str | None:
    """Why ``owner`` is not a valid ``OwnerId`` (field name and rule only), or None."""
    if type(owner) is not OwnerId:
        return "must be an OwnerId"
    p = identifier_problem(owner.host_id)
    if p:
        return f"host_id {p}"
    if not is_safe_int(owner.pid):
        return "pid must be a non-negative safe integer"
    p = identifier_problem(owner.nonce)
    if p:
        return f"nonce {p}"
    return None
