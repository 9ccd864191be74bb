"""The contract every registered proposer must keep (see ``infrarsi.proposers.base``)."""

from __future__ import annotations

import math

import pytest

from infrarsi.core.knobs import Constraint, Knob, KnobSpace
from infrarsi.core.trial import Outcome, Role, TrialResult
from infrarsi.proposers import SearchContext, make_proposer, proposer_names

SPACE = KnobSpace(
    knobs=(Knob(name="a", values=(0, 1, 2)), Knob(name="b", values=("x", "y")), Knob(name="c", values=("p", "q", "r"))),
    constraints=(Constraint("not (a == 2 and b == 'y')"),),
)
BASELINE = {"a": 0, "b": "x", "c": "p"}
CAPACITY = 100


def objective(config, trial_id: str, force: Outcome | None = None) -> TrialResult:
    """Time falls with a and with c != p; a == 2 runs out of memory unless c == r."""
    common = dict(trial_id=trial_id, config=config, role=Role.SEARCH, memory_capacity_bytes=CAPACITY)
    if force is Outcome.OOM or (force is None and config["a"] == 2 and config["c"] != "r"):
        return TrialResult(outcome=Outcome.OOM, peak_memory_bytes=CAPACITY, **common)
    if force is not None:
        return TrialResult(outcome=force, reason="injected", **common)
    step = math.exp(-0.3 * config["a"] - 0.1 * (config["c"] != "p") + 0.05 * (config["b"] == "y"))
    return TrialResult(outcome=Outcome.OK, step_time_s=step, peak_memory_bytes=40 + 20 * config["a"], **common)


def make(name: str, seed: int = 0):
    return make_proposer(name, SearchContext(space=SPACE, baseline=BASELINE, memory_capacity_bytes=CAPACITY, seed=seed))


def drive(proposer, batch: int, rounds: int, force: Outcome | None = None) -> list[list[dict]]:
    out, n = [], 0
    for _ in range(rounds):
        configs = proposer.suggest(batch)
        out.append(configs)
        for c in configs:
            n += 1
            proposer.observe(objective(c, f"t{n}", force))
    return out


@pytest.fixture(params=proposer_names())
def name(request) -> str:
    return request.param


def test_same_seed_same_observations_same_suggestions(name):
    assert drive(make(name, seed=3), batch=2, rounds=3) == drive(make(name, seed=3), batch=2, rounds=3)


def test_suggestions_feasible_new_and_exhaustive(name):
    proposer = make(name)
    proposer.observe(objective(BASELINE, "baseline").replace(role=Role.DOCTOR))
    seen = [SPACE.key(BASELINE)]
    while batch := proposer.suggest(4):
        assert len(batch) <= 4
        for c in batch:
            assert SPACE.is_feasible(c)
            seen.append(SPACE.key(c))
            proposer.observe(objective(c, f"t{len(seen)}"))
    assert len(seen) == len(set(seen)) == len(SPACE.feasible)
    assert proposer.suggest(3) == []


def test_pending_suggestions_are_not_repeated(name):
    proposer = make(name)
    first, second = proposer.suggest(3), proposer.suggest(3)
    keys = [SPACE.key(c) for c in first + second]
    assert len(keys) == len(set(keys)) == 6


@pytest.mark.parametrize("failure", [Outcome.OOM, Outcome.CRASH, Outcome.TIMEOUT])
def test_all_failed_history(name, failure):
    proposer = make(name)
    batches = drive(proposer, batch=3, rounds=3, force=failure)
    assert all(len(b) == 3 for b in batches)
    proposer.describe()


def test_batch_larger_than_remaining_space(name):
    proposer = make(name)
    drive(proposer, batch=5, rounds=2)
    remaining = len(SPACE.feasible) - 10
    rest = proposer.suggest(remaining + 3)
    assert len(rest) == remaining
    assert proposer.suggest(1) == []
