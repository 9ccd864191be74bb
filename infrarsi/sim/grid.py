"""Every config of a knob space as numpy columns, for the vectorised cost model.

Enumeration and the constraint interpreter live in ``infrarsi.core.knobs`` (``KnobSpace``
evaluates constraints on whole columns); this module only names the pieces the
simulator and the oracle use.
"""

from __future__ import annotations

import numpy as np

from infrarsi.core.knobs import KnobSpace


def index_grid(space: KnobSpace) -> np.ndarray:
    """``[space.size, num_knobs]`` value indices of every config, in product order."""
    return space.index_grid()


def feasible_mask(space: KnobSpace, cols: dict[str, np.ndarray]) -> np.ndarray:
    n = len(next(iter(cols.values())))
    mask = np.ones(n, dtype=bool)
    for c in space.constraints:
        mask &= c.mask(cols)
    return mask


def feasible_columns(space: KnobSpace) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Value indices and columns of every feasible config, in ``KnobSpace.feasible`` order."""
    idx = space.feasible_index_matrix
    return idx, space.columns(idx)
