"""Projection builders: checkpoints, stale rejection, rotation rebuild (built out by the projections issue)."""
