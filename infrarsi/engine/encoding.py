"""One-hot encoding of configs relative to the baseline, shared by every engine model.

A *setting* is one (knob, value) pair whose value differs from the baseline's; each gets a
0/1 column, so the baseline config encodes to all zeros and a coefficient is exactly the
setting's log effect relative to the baseline, the same scale as ``Priors``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from infrarsi.knobs import Config, KnobSpace, Value


@dataclass(frozen=True)
class Encoding:
    space: KnobSpace
    baseline: Config

    @cached_property
    def baseline_indices(self) -> tuple[int, ...]:
        return self.space.indices(self.baseline)

    @cached_property
    def settings(self) -> list[tuple[int, int]]:
        """(knob index, value index) of every non-baseline setting, in a fixed order."""
        out = []
        for k, knob in enumerate(self.space.knobs):
            out += [(k, v) for v in range(len(knob.values)) if v != self.baseline_indices[k]]
        return out

    @property
    def num_settings(self) -> int:
        return len(self.settings)

    def label(self, j: int) -> tuple[str, Value]:
        k, v = self.settings[j]
        knob = self.space.knobs[k]
        return knob.name, knob.values[v]

    def column_of(self, knob: str, value: Value) -> int | None:
        k = self.space.names.index(knob)
        v = self.space.knobs[k].index(value)
        try:
            return self.settings.index((k, v))
        except ValueError:  # the baseline's own value has no column
            return None

    def main(self, index_matrix: np.ndarray) -> np.ndarray:
        """``[n, num_settings]`` 0/1 design of configs given as value indices."""
        index_matrix = np.asarray(index_matrix, dtype=np.int64).reshape(-1, len(self.space.knobs))
        cols = [index_matrix[:, k] == v for k, v in self.settings]
        if not cols:
            return np.zeros((len(index_matrix), 0))
        return np.stack(cols, axis=1).astype(float)

    def configs(self, configs: list[Config]) -> np.ndarray:
        idx = np.array([self.space.indices(c) for c in configs], dtype=np.int64)
        return idx.reshape(len(configs), len(self.space.knobs))

    @cached_property
    def feasible_main(self) -> np.ndarray:
        return self.main(self.space.feasible_index_matrix)

    @cached_property
    def feasible_row(self) -> dict[tuple, int]:
        return {self.space.key(c): i for i, c in enumerate(self.space.feasible)}


def pair_columns(main: np.ndarray, pairs: list[tuple[int, int]]) -> np.ndarray:
    """Interaction columns: the product of two settings' main columns."""
    if not pairs:
        return np.zeros((main.shape[0], 0))
    a, b = np.array(pairs).T
    return main[:, a] * main[:, b]
