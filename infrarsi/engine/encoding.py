"""One-hot encoding of configs relative to the baseline, shared by every engine model.

A *setting* is one (knob, value) pair whose value differs from the baseline's; each gets a
0/1 column, so the baseline config encodes to all zeros and a coefficient is exactly the
setting's log effect relative to the baseline, the same scale as ``Priors``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from infrarsi.core.knobs import Config, KnobSpace, Value

# How far a knob's prior effects may be off in scale, shared by its levels (one sd: 50%).
PRIOR_SCALE_STD = 0.5
# Of a multi-level knob's per-setting prior variance, the part left to each setting alone
# (the rest of the uncertainty is the shared scale).
SETTING_SHARE = 0.25


def _positive_numbers(values: tuple) -> bool:
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in values)


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

    def prior_covariance(self, mean: np.ndarray, std: np.ndarray, scale_std: float,
                         slope_std: float = 0.0) -> np.ndarray:
        """Prior covariance of the setting effects: each setting's own sd, plus a scale
        shared by the settings of one knob, plus (``slope_std`` > 0) a slope in log2 of a
        numeric knob's value shared by its levels.

        A knob's priors come from one mechanism (activations grow with the micro-batch, a
        collective grows with the group), so if it is weaker or stronger on this job than
        the table says, it is so at every level: effect = mean * (1 + e_knob) + e_setting,
        e_knob ~ N(0, scale_std^2). Measuring one level then moves the others with it (a
        micro-batch of 8 that costs a third of the memory the table said tells that 64
        does too), where independent priors would leave untried levels at the table's guess.
        The scale cannot turn a prior's sign; the slope can: effect += s * log2(value /
        baseline value), s ~ N(0, slope_std^2), so expert parallelism 2 measured faster
        than the prior said makes 4 likely faster still (an effect smooth in the log of a
        size or degree), and an untried level far from the baseline more uncertain.
        """
        var = np.asarray(std, dtype=float) ** 2
        cov = np.diag(var)
        for k in range(len(self.space.knobs)):
            cols = [j for j, (kk, _) in enumerate(self.settings) if kk == k]
            if len(cols) >= 2:
                m = np.asarray(mean, dtype=float)[cols]
                block = np.diag(var[cols] * SETTING_SHARE) + scale_std**2 * np.outer(m, m)
                cov[np.ix_(cols, cols)] = block
            knob = self.space.knobs[k]
            if slope_std > 0 and len(cols) >= 2 and _positive_numbers(knob.values):
                base = self.baseline[knob.name]
                d = np.array([np.log2(knob.values[self.settings[j][1]] / base) for j in cols])
                cov[np.ix_(cols, cols)] += slope_std**2 * np.outer(d, d)
        return cov

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
