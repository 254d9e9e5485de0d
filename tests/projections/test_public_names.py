"""The errors a builder raises import from ``fencepost.projections``, where the builder and the
projections do, as well as from ``fencepost``: the projection pages use ``ProjectionError`` with
the builder's other names, and ``from fencepost.projections import ProjectionError`` failed."""

from __future__ import annotations

import fencepost
import fencepost.projections as projections


def test_the_builders_errors_import_from_the_projections_package() -> None:
    from fencepost.projections import ProjectionError, SourceChanged

    assert ProjectionError is fencepost.ProjectionError and SourceChanged is fencepost.SourceChanged
    assert {"ProjectionError", "SourceChanged"} <= set(projections.__all__)
    assert all(hasattr(projections, name) for name in projections.__all__)
