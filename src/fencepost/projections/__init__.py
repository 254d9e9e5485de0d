"""Projection builders: exactly-once checkpoints, stale rejection, rebuild on source rotation.

``ProjectionBuilder(source_store, target_url, projection)`` keeps a read model on a target database
(the source's own or another, either backend); ``ProjectionBuilder({"edge-1": a, "central": b}, ...)``
keeps one fed by several named stores, one checkpoint per source; see ``docs/concepts/projections.md``.
"""

from fencepost.errors import ProjectionError, SourceChanged
from fencepost.projections.builder import CatchUp, NamedSources, OneSource, ProjectionBuilder, ProjectionStatus
from fencepost.projections.builtin import OwnershipHistory, RunsByStatus
from fencepost.projections.checkpoints import RebuildRecord
from fencepost.projections.protocol import ConsensusFact, Projection, Target

__all__ = [
    "CatchUp",
    "ConsensusFact",
    "NamedSources",
    "OneSource",
    "OwnershipHistory",
    "Projection",
    "ProjectionBuilder",
    "ProjectionError",
    "ProjectionStatus",
    "RebuildRecord",
    "RunsByStatus",
    "SourceChanged",
    "Target",
]
