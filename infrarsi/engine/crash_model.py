"""Crash model: which settings, groups of settings and pairs of them make a job crash.

Noisy-OR over *units*. A unit is a predicate on one knob, or a pair of predicates on two
knobs. The predicates of a knob are its values (``ep = 8``) and, for a knob of three or
more values, the groups a failing rule is usually written in: for a numeric knob the
values above or below the baseline's (``ep > 1``: "expert parallelism at all"), for any
other the values that are not the baseline's (``recompute != full``). A crash seen at
``ep = 2`` and another at ``ep = 8`` are then one rule, not two, and ``ep = 4`` is suspect
before it has crashed.

A config runs unless one of the units it holds fires, unit u firing with probability
q_u. q_u has a Beta prior whose mean spreads a per-config base crash rate over the units;
it is fitted by EM, so a crash is blamed on the units that trials which ran have not
exonerated (a crashing pair is told apart from its two settings, which run fine
elsewhere). Every unit keeps the ids of the crashed trials that hold it, and their reason
classes (crash, invalid, timeout, contract_violation), as evidence for the report.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from infrarsi.core.knobs import Config, KnobSpace
from infrarsi.core.trial import Outcome

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
# Each unit's Beta prior weighs a fifth of a trial. Crashes of one combination repeat (a
# compile error, an unsupported pair of features): they are not coin flips, so a unit
# blamed for one crash should make the configs that hold it unlikely to run. With one
# pseudo-trial it got q = 1/2 and the engine went on trying it (the crash bar is lower
# than that); with 0.2 it gets 0.83. On the generated development jobs (seeds 0-3 of the
# development split and two of each extra development job) the round of changes this
# was part of (value groups, memory by parts, a crash bar of 0.3) took the crashed trials
# per 20-trial search from 5.0 to 4.5 and the failed share of trial time from 21% to 13%.
_PRIOR_TRIALS = 0.2
_EM_ROUNDS = 50
FLAG_PROBABILITY = 0.5


def _numeric(values: tuple) -> bool:
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)


@dataclass(frozen=True)
class Predicate:
    """A set of values of one knob; ``label`` is how the report writes it."""

    knob: int
    members: np.ndarray  # bool per value index
    label: object


def knob_predicates(space: KnobSpace, baseline: Config) -> list[Predicate]:
    """Each value of each knob, then the groups of values above / below / other than the
    baseline's (only groups of two or more values: a group of one is that value)."""
    out: list[Predicate] = []
    for k, knob in enumerate(space.knobs):
        n, b = len(knob.values), knob.index(baseline[knob.name])
        for v, value in enumerate(knob.values):
            out.append(Predicate(k, np.arange(n) == v, value))
        if n < 3:
            continue
        if _numeric(knob.values):
            order = np.array(knob.values, dtype=float)
            groups = [(order > order[b], f"> {knob.values[b]}"), (order < order[b], f"< {knob.values[b]}")]
        else:
            groups = [(np.arange(n) != b, f"!= {knob.values[b]}")]
        out += [Predicate(k, members, label) for members, label in groups if members.sum() >= 2]
    return out


@dataclass
class CrashModel:
    space: KnobSpace
    baseline: Config
    single: np.ndarray = field(init=False)   # [P] hazard of each predicate
    pair: np.ndarray = field(init=False)     # [P, P] hazard of each pair (0 within a knob)
    evidence: dict[tuple, list[str]] = field(init=False, default_factory=dict)
    reasons: dict[str, str] = field(init=False, default_factory=dict)  # trial id -> reason class

    def __post_init__(self) -> None:
        self.predicates = knob_predicates(self.space, self.baseline)
        knob_of = np.array([p.knob for p in self.predicates])
        self._cross = knob_of[:, None] != knob_of[None, :]
        self._upper = np.triu(self._cross, 1)
        self._columns = [np.flatnonzero(knob_of == k) for k in range(len(self.space.knobs))]
        # Per knob: [num values, its predicates] membership, to build features by lookup.
        self._lookup = [np.array([self.predicates[p].members for p in cols]).T for cols in self._columns]
        self.single_n = np.zeros(len(self.predicates))
        self.pair_n = np.zeros((len(self.predicates),) * 2)
        self._reset(_BASE_CRASH_RATE)

    def _reset(self, base_crash_rate: float) -> None:
        num_knobs = len(self.space.knobs)
        # The units one config holds (a predicate per knob and their pairs, leaving the
        # value groups aside) share the base rate.
        num_units = num_knobs + num_knobs * (num_knobs - 1) / 2
        self.prior_mean = 1.0 - (1.0 - base_crash_rate) ** (1.0 / max(num_units, 1))
        self.single = np.full(len(self.predicates), self.prior_mean)
        self.pair = np.where(self._cross, self.prior_mean, 0.0)

    def features(self, index_matrix: np.ndarray) -> np.ndarray:
        """``[n, num_predicates]`` 0/1: which predicates each config (value indices) holds."""
        x = np.asarray(index_matrix, dtype=np.int64).reshape(-1, len(self.space.knobs))
        out = np.zeros((len(x), len(self.predicates)))
        for k, cols in enumerate(self._columns):
            out[:, cols] = self._lookup[k][x[:, k]]
        return out

    def fit(self, index_matrix: np.ndarray, crashed: np.ndarray, trial_ids: list[str],
            reasons: list[str] | None = None) -> "CrashModel":
        """EM for the noisy-OR on every trial that says whether the config starts (ok and
        OOM trials ran; the crash outcomes did not); ``reasons``: each trial's reason
        class, for the report."""
        self.reasons = dict(zip(map(str, trial_ids), reasons)) if reasons is not None else {}
        feats = self.features(index_matrix)
        crashed = np.asarray(crashed, dtype=bool)
        self._reset((crashed.sum() + _BASE_RATE_PRIOR_TRIALS * _BASE_CRASH_RATE)
                    / (len(crashed) + _BASE_RATE_PRIOR_TRIALS))
        self.single_n, self.pair_n = feats.sum(axis=0), feats.T @ feats
        self._collect_evidence(feats, crashed, trial_ids)
        a, b = self.prior_mean * _PRIOR_TRIALS, (1.0 - self.prior_mean) * _PRIOR_TRIALS
        fired_single, fired_pair = np.zeros_like(self.single), np.zeros_like(self.pair)
        hit = feats[crashed]
        for _ in range(_EM_ROUNDS if crashed.any() else 1):
            if crashed.any():
                # E-step: each crashed trial's blame on a unit it holds is q_u / P(crash).
                weight = 1.0 / np.maximum(1.0 - np.exp(self._log_no_crash(hit)), 1e-12)
                fired_single = self.single * (hit * weight[:, None]).sum(axis=0)
                fired_pair = self.pair * ((hit * weight[:, None]).T @ hit)
            self.single = (a + fired_single) / (a + b + self.single_n)
            self.pair = np.where(self._cross, (a + fired_pair) / (a + b + self.pair_n), 0.0)
        return self

    def _collect_evidence(self, feats: np.ndarray, crashed: np.ndarray, trial_ids: list[str]) -> None:
        self.evidence = {}
        for row, tid in zip(feats[crashed], np.asarray(trial_ids, dtype=object)[crashed]):
            held = np.flatnonzero(row)
            for i, p in enumerate(held):
                self.evidence.setdefault((int(p),), []).append(str(tid))
                for q in held[i + 1:]:
                    if self._cross[p, q]:
                        self.evidence.setdefault((int(p), int(q)), []).append(str(tid))

    def _log_no_crash(self, feats: np.ndarray) -> np.ndarray:
        log_pair = np.log1p(-np.minimum(self.pair, 1.0 - 1e-12)) * self._upper
        return feats @ np.log1p(-self.single) + ((feats @ log_pair) * feats).sum(axis=1)

    def no_crash_probability(self, index_matrix: np.ndarray) -> np.ndarray:
        return np.exp(self._log_no_crash(self.features(index_matrix)))

    def _hazard(self, unit: tuple) -> float:
        return float(self.single[unit[0]] if len(unit) == 1 else self.pair[unit])

    def _count_of(self, unit: tuple) -> float:
        return float(self.single_n[unit[0]] if len(unit) == 1 else self.pair_n[unit])

    def _label(self, unit: tuple) -> list[list]:
        return [[self.space.knobs[self.predicates[p].knob].name, self.predicates[p].label] for p in unit]

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
