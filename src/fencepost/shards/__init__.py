"""Shards: several ordinary stores used as one run store, routed by run id.

``placement`` decides where a new run goes (rendezvous hashing), ``membership`` records and checks
which stores form a set, ``router`` is the ``ShardSet`` with its routed ``runs``, ``attempts`` and
``journal`` and its merged, shard-labelled change feed, ``supervision`` the ``ShardSupervisor`` that
pulses each shard on its own.
"""

from fencepost.shards.membership import Membership, ShardError
from fencepost.shards.placement import place
from fencepost.shards.router import ShardChange, ShardSet, open_shards
from fencepost.shards.supervision import ShardSupervisor

__all__ = ["Membership", "ShardChange", "ShardError", "ShardSet", "ShardSupervisor", "open_shards", "place"]
