"""``make_mesh``: a device mesh whose axes let GSPMD propagate shardings (``AxisType.Auto``)."""

from __future__ import annotations

from collections.abc import Sequence

import jax
from jax.sharding import AxisType, Mesh


def make_mesh(shape: Sequence[int], axis_names: Sequence[str], devices=None) -> Mesh:
    """A ``Mesh`` of ``shape`` over ``devices`` (default: every device of every process).

    The axes are ``AxisType.Auto``: PyTorch programs carry no sharding annotations, so the
    compiler propagates shardings from the inputs (``jax.make_mesh``'s default, ``Explicit``,
    would make shardings part of every op's type instead).
    """
    return jax.make_mesh(
        tuple(shape),
        tuple(axis_names),
        axis_types=(AxisType.Auto,) * len(axis_names),
        devices=devices,
    )
