import numpy as np
import pytest

from infrarsi.core.errors import SpecError
from infrarsi.core.knobs import Constraint, Knob, KnobSpace


@pytest.fixture
def space() -> KnobSpace:
    return KnobSpace(
        (Knob(name="micro_batch", values=(1, 2, 4, 8)), Knob(name="ckpt", values=("none", "full")),
         Knob(name="nproc", values=(1, 2)), Knob(name="threads", values=(1, 2))),
        (Constraint("nproc * threads <= 2"), Constraint("not (micro_batch == 8 and ckpt == 'none')")),
    )


def test_feasible_configs_respect_every_constraint(space):
    feasible = space.feasible
    # 4*2 (mb, ckpt) minus the one excluded pair = 7; (nproc, threads) pairs with product <= 2 = 3
    assert len(feasible) == 7 * 3
    assert all(c["nproc"] * c["threads"] <= 2 for c in feasible)
    assert not any(c["micro_batch"] == 8 and c["ckpt"] == "none" for c in feasible)
    assert space.feasible_index_matrix.shape == (21, 4)


def test_sample_is_seeded_distinct_and_excludes(space):
    a = space.sample(np.random.default_rng(3), 5)
    b = space.sample(np.random.default_rng(3), 5)
    assert a == b
    keys = [space.key(c) for c in a]
    assert len(set(keys)) == 5
    rest = space.sample(np.random.default_rng(0), 100, exclude=keys)
    assert len(rest) == 16 and not set(keys) & {space.key(c) for c in rest}


def test_neighbours_change_exactly_one_knob_and_stay_feasible(space):
    base = {"micro_batch": 2, "ckpt": "full", "nproc": 1, "threads": 1}
    for n in space.neighbours(base):
        assert sum(n[k] != base[k] for k in base) == 1
        assert space.is_feasible(n)


@pytest.mark.parametrize("config, message", [
    ({"micro_batch": 3, "ckpt": "none", "nproc": 1, "threads": 1}, "value 3 is not in its domain"),
    ({"micro_batch": 1, "ckpt": "none", "nproc": 1}, "missing value for knob(s) ['threads']"),
    ({"micro_batch": 1, "ckpt": "none", "nproc": 1, "threads": 1, "turbo": 1}, "unknown knob(s) ['turbo']"),
])
def test_validate_names_the_problem(space, config, message):
    with pytest.raises(SpecError, match=message.replace("[", r"\[").replace("]", r"\]").replace("(", r"\(").replace(")", r"\)")):
        space.validate(config)


def test_constraints_never_evaluate_arbitrary_code():
    with pytest.raises(SpecError, match="unsupported syntax Call"):
        Constraint("__import__('os').system('true')").holds({})
    with pytest.raises(SpecError, match="not a valid expression"):
        Constraint("nproc <=")


def test_constraint_on_unknown_knob_is_a_spec_error():
    with pytest.raises(SpecError, match=r"unknown knob\(s\) \['gpus'\]"):
        KnobSpace((Knob(name="nproc", values=(1, 2)),), (Constraint("nproc <= gpus"),))


def test_vectorised_feasibility_matches_one_config_at_a_time(space):
    one_by_one = [c for c in space.iter_all() if space.is_feasible(c)]
    assert list(space.feasible) == one_by_one
