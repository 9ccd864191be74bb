"""Crash model: which settings and setting pairs make a job crash, from crashed trials.

Noisy-OR over *units* (every single setting and every pair of settings a config holds): a
config runs unless one of its units fires, unit u firing with probability q_u. q_u has a
Beta prior whose mean spreads a small per-config base crash rate over the units; it is
fitted by EM, so a crash is blamed on the units that ok trials have not exonerated (a
crashing pair is told apart from its two settings, which run fine elsewhere). Every unit
keeps the ids of the crashed trials that hold it, and their reason classes (crash,
invalid, timeout, contract_violation), as evidence for the report.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import numpy as np

from infrarsi.knobs import KnobSpace
from infrarsi.trial import Outcome

# A contract violation counts too: the settings (or patch) that broke the contract once
# would break it again, so they are learned against like a crash.
CRASH_OUTCOMES = (Outcome.CRASH, Outcome.INVALID, Outcome.TIMEOUT, Outcome.CONTRACT_VIOLATION)
# The reason class each failure is reported under.
REASON_CLASS = {Outcome.CRASH: "crash", Outcome.INVALID: "invalid", Outcome.TIMEOUT: "timeout",
                Outcome.CONTRACT_VIOLATION: "contract_violation"}
# A priori ~5% of configs fail for non-memory reasons (compile errors, unsupported
# combinations), worth a few pseudo-trials: the stack's own crash rate, measured on the
# trials so far, soon replaces it (empirical Bayes), so an untried unit is as risky as
# this stack has shown untried combinations to be.
_BASE_CRASH_RATE = 0.05
_BASE_RATE_PRIOR_TRIALS = 4.0
# Each unit's Beta prior weighs one pseudo-trial, so a single crash already counts.
_PRIOR_TRIALS = 1.0
_EM_ROUNDS = 50
FLAG_PROBABILITY = 0.5


@dataclass
class CrashModel:
    space: KnobSpace
    single: list[np.ndarray] = field(init=False)
    pair: dict[tuple[int, int], np.ndarray] = field(init=False)
    evidence: dict[tuple, list[str]] = field(init=False, default_factory=dict)
    reasons: dict[str, str] = field(init=False, default_factory=dict)  # trial id -> reason class

    def __post_init__(self) -> None:
        self._reset()

    def _reset(self, base_crash_rate: float = _BASE_CRASH_RATE) -> None:
        num_knobs = len(self.space.knobs)
        self.knob_pairs = list(itertools.combinations(range(num_knobs), 2))
        num_units = num_knobs + len(self.knob_pairs)
        self.prior_mean = 1.0 - (1.0 - base_crash_rate) ** (1.0 / max(num_units, 1))
        sizes = [len(k.values) for k in self.space.knobs]
        self.single = [np.full(n, self.prior_mean) for n in sizes]
        self.pair = {(i, j): np.full((sizes[i], sizes[j]), self.prior_mean) for i, j in self.knob_pairs}
        self.single_n = [np.zeros(n) for n in sizes]
        self.pair_n = {p: np.zeros_like(q) for p, q in self.pair.items()}

    def _gather(self, x: np.ndarray) -> np.ndarray:
        """``[n, num_units]`` hazards of each row's units."""
        cols = [self.single[k][x[:, k]] for k in range(x.shape[1])]
        cols += [self.pair[(i, j)][x[:, i], x[:, j]] for i, j in self.knob_pairs]
        return np.stack(cols, axis=1) if cols else np.zeros((len(x), 0))

    def fit(self, index_matrix: np.ndarray, crashed: np.ndarray, trial_ids: list[str],
            reasons: list[str] | None = None) -> "CrashModel":
        """EM for the noisy-OR on every trial that ran or crashed (not OOMs); ``reasons``:
        each trial's reason class, for the report."""
        self.reasons = dict(zip(map(str, trial_ids), reasons)) if reasons is not None else {}
        x = np.asarray(index_matrix, dtype=np.int64).reshape(-1, len(self.space.knobs))
        crashed = np.asarray(crashed, dtype=bool)
        self._reset((crashed.sum() + _BASE_RATE_PRIOR_TRIALS * _BASE_CRASH_RATE)
                    / (len(crashed) + _BASE_RATE_PRIOR_TRIALS))
        self._count(x, crashed, trial_ids)
        if not crashed.any():
            self._m_step(x, np.zeros((len(x), x.shape[1] + len(self.knob_pairs))))
            return self
        for _ in range(_EM_ROUNDS):
            q = self._gather(x)
            p_crash = 1.0 - np.prod(1.0 - q, axis=1, keepdims=True)
            blame = np.where(crashed[:, None], np.minimum(q / np.maximum(p_crash, 1e-12), 1.0), 0.0)
            self._m_step(x, blame)
        return self

    def _count(self, x: np.ndarray, crashed: np.ndarray, trial_ids: list[str]) -> None:
        self.evidence = {}
        for k in range(x.shape[1]):
            np.add.at(self.single_n[k], x[:, k], 1.0)
        for p in self.knob_pairs:
            np.add.at(self.pair_n[p], (x[:, p[0]], x[:, p[1]]), 1.0)
        for row, tid in zip(x[crashed], np.asarray(trial_ids, dtype=object)[crashed]):
            for unit in self._units_of(row):
                self.evidence.setdefault(unit, []).append(str(tid))

    def _units_of(self, row: np.ndarray) -> list[tuple]:
        singles = [((k, int(row[k])),) for k in range(len(row))]
        return singles + [((i, int(row[i])), (j, int(row[j]))) for i, j in self.knob_pairs]

    def _m_step(self, x: np.ndarray, blame: np.ndarray) -> None:
        a, b = self.prior_mean * _PRIOR_TRIALS, (1.0 - self.prior_mean) * _PRIOR_TRIALS
        num_knobs = x.shape[1]
        for k in range(num_knobs):
            fired = np.zeros_like(self.single[k])
            np.add.at(fired, x[:, k], blame[:, k])
            self.single[k] = (a + fired) / (a + b + self.single_n[k])
        for c, (i, j) in enumerate(self.knob_pairs):
            fired = np.zeros_like(self.pair[(i, j)])
            np.add.at(fired, (x[:, i], x[:, j]), blame[:, num_knobs + c])
            self.pair[(i, j)] = (a + fired) / (a + b + self.pair_n[(i, j)])

    def no_crash_probability(self, index_matrix: np.ndarray) -> np.ndarray:
        x = np.asarray(index_matrix, dtype=np.int64).reshape(-1, len(self.space.knobs))
        return np.exp(np.log1p(-self._gather(x)).sum(axis=1))

    def _hazard(self, unit: tuple) -> float:
        if len(unit) == 1:
            (k, v), = unit
            return float(self.single[k][v])
        (i, vi), (j, vj) = unit
        return float(self.pair[(i, j)][vi, vj])

    def _label(self, unit: tuple) -> list[list]:
        return [[self.space.knobs[k].name, self.space.knobs[k].values[v]] for k, v in unit]

    def flagged(self, threshold: float = FLAG_PROBABILITY) -> list[dict]:
        """Units whose crash probability is at least ``threshold``, with their evidence."""
        out = []
        for unit, trial_ids in self.evidence.items():
            q = self._hazard(unit)
            if q >= threshold:
                out.append({"settings": self._label(unit), "crash_probability": round(q, 4),
                            "crashed_trials": sorted(trial_ids), "num_trials": int(self._count_of(unit)),
                            "reasons": sorted({self.reasons.get(t, "crash") for t in trial_ids})})
        return sorted(out, key=lambda d: -d["crash_probability"])

    def _count_of(self, unit: tuple) -> float:
        if len(unit) == 1:
            (k, v), = unit
            return self.single_n[k][v]
        (i, vi), (j, vj) = unit
        return self.pair_n[(i, j)][vi, vj]
