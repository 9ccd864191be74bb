"""Trial slots as real Ray actors: GPU pinning and a death mid-trial."""

import sys
from pathlib import Path

import pytest

from infrarsi.adapters.ray_pool import PoolSettings, TrialPool
from infrarsi.core.errors import TrialInfrastructureError
from infrarsi.core.trial import Outcome, Role
from infrarsi.harness.launcher import TrialRequest

FAKE = str(Path(__file__).parent / "fake_workload.py")


def _req(tmp_path, trial_id, mode):
    return TrialRequest(trial_id=trial_id, config={"mode": mode}, role=Role.SEARCH,
                        argv=(sys.executable, FAKE, "--mode", mode, "--steps", "3"), env={}, cwd=str(tmp_path),
                        trial_dir=str(tmp_path / trial_id), memory_capacity_bytes=2**31, emulate_capacity=True,
                        timeout_s=60, warmup_steps=1, num_steps=3)


def test_each_actor_is_pinned_to_its_own_gpu(ray_session, tmp_path):
    pool = TrialPool(PoolSettings(gpus_per_trial=1, cpus_per_trial=1))
    try:
        assert pool.num_slots == 2  # two logical GPUs, one per trial
        pool.submit(_req(tmp_path, "t1", "gpus"))
        pool.submit(_req(tmp_path, "t2", "gpus"))
        results = []
        while pool.busy:
            results += pool.wait()
    finally:
        pool.close()
    assert {r.outcome for r in results} == {Outcome.OK}
    seen = set()
    for r in results:
        line = next(ln for ln in Path(r.log_path).read_text().splitlines() if ln.startswith("CUDA_VISIBLE_DEVICES"))
        seen.add(line.split()[1])
    assert seen == {"0", "1"}


@pytest.mark.fault
def test_an_actor_that_dies_mid_trial_is_replaced_and_the_trial_retried_once(ray_session, tmp_path):
    pool = TrialPool(PoolSettings(cpus_per_trial=1, concurrency=1))
    try:
        attempts = pool.run_one(_req(tmp_path, "t1", "kill-actor"))
    finally:
        pool.close()
    assert [a.attempt for a in attempts] == [1, 2]
    assert attempts[0].outcome is Outcome.CRASH and attempts[0].extra["actor_died"]
    assert attempts[0].extra["retried"] is True
    assert attempts[1].outcome is Outcome.OK


@pytest.mark.fault
def test_an_actor_lost_on_the_retry_too_is_an_infrastructure_fault(ray_session, tmp_path):
    pool = TrialPool(PoolSettings(cpus_per_trial=1, concurrency=1))
    try:
        pool.submit(_req(tmp_path, "t1", "kill-actor-always"))
        [first] = pool.wait()  # the pool's own retry: the lost attempt, superseded
        assert first.extra["actor_died"] and first.extra["retried"] and first.attempt == 1
        with pytest.raises(TrialInfrastructureError, match="trial t1 lost its Ray actor 2 times"):
            pool.wait()
    finally:
        pool.close()
