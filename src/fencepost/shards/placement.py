"""Where a new run goes: rendezvous (highest-random-weight) hashing over the shard names.

Each shard scores every run id with a keyed hash of ``(shard name, run id)``; the highest score
wins. A name's scores never depend on the other names, so adding a shard to a set of ``N`` moves
only the ids the new shard now wins (about ``1/(N+1)`` of *new* placements) and removing one moves
only the ids it held. Placement decides where a run is *created*; existing runs never move, so a
lookup of an existing run also probes the other shards (see ``router.py``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

__all__ = ["place", "score"]


def score(shard_name: str, run_id: str) -> int:
    """The weight of ``run_id`` on ``shard_name``: 64 bits of BLAKE2b over both, stable across processes."""
    digest = hashlib.blake2b(run_id.encode("utf-8", "surrogatepass"), digest_size=8,
                             key=shard_name.encode("ascii")).digest()
    return int.from_bytes(digest, "big")


def place(run_id: str, shard_names: Sequence[str]) -> str:
    """The shard (of ``shard_names``, at least one) that a new ``run_id`` is created on."""
    if not shard_names:
        raise ValueError("a shard set has at least one shard")
    # Ties (64-bit collisions) fall to the name that sorts first, so every process agrees.
    return max(shard_names, key=lambda name: (score(name, run_id), _neg(name)))


def _neg(name: str) -> tuple[int, ...]:
    return tuple(-ord(c) for c in name)
