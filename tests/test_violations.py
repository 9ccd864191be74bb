"""A contract violation teaches the search: the engine's crash model blames the settings
that caused it (reason class contract_violation), the Optuna baselines get a violation
constraint."""

from __future__ import annotations

import numpy as np
from tiny_gpt import knob_space

from infrarsi.core.trial import Outcome, Role, TrialResult
from infrarsi.proposers import SearchContext, make_proposer

KNOBS = {"micro_batch": [2, 4, 8], "patch_fast": [False, True], "attention": ["naive", "sdpa"]}
BASE = {"micro_batch": 2, "patch_fast": False, "attention": "naive"}


def result(i: int, outcome: Outcome = Outcome.OK, **changes) -> TrialResult:
    return TrialResult(trial_id=f"t{i}", config={**BASE, **changes}, role=Role.SEARCH, outcome=outcome,
                       step_time_s=1.0 - 0.05 * i if outcome is Outcome.OK else None,
                       reason="" if outcome is Outcome.OK else "loss at step 3 off the reference")


def history() -> list[TrialResult]:
    return [result(0), result(1, micro_batch=4), result(2, attention="sdpa"), result(3, micro_batch=8),
            result(4, Outcome.CONTRACT_VIOLATION, patch_fast=True),
            result(5, Outcome.CONTRACT_VIOLATION, patch_fast=True, micro_batch=4)]


def test_the_engine_learns_against_the_setting_that_violated():
    space = knob_space(KNOBS)
    proposer = make_proposer("engine", SearchContext(space=space, baseline=BASE, seed=0))
    for r in history():
        proposer.observe(r)
    proposer.describe()  # refits
    top = proposer.crash_model.flagged(threshold=0.3)[0]
    assert top["settings"] == [["patch_fast", True]] and top["reasons"] == ["contract_violation"]
    x = space.feasible_index_matrix
    p_ok = proposer.crash_model.no_crash_probability(x)
    with_patch = np.array([space.from_indices(row)["patch_fast"] for row in x])
    assert p_ok[with_patch].max() < 0.6 < 0.85 < p_ok[~with_patch].min()


def test_optuna_baselines_get_a_violation_constraint():
    space = knob_space(KNOBS)
    proposer = make_proposer("tpe", SearchContext(space=space, baseline=BASE, seed=0))
    for r in history():
        proposer.observe(r)
    cons = [{k.split(":")[1]: v for k, v in t.system_attrs.items() if k.startswith("constraints:")}
            for t in proposer.study.trials]
    assert cons[4] == cons[5] == {"oom": 0.0, "crash": 0.0, "violation": 1.0}
    assert cons[0] == {"oom": 0.0, "crash": 0.0, "violation": 0.0}
