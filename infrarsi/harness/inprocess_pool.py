"""Trial slots without Ray: one trial at a time, launched from this process.

For a machine that has the accelerator but not Ray (``benchmarks/gpu_check.py`` on a GPU
box whose Python lacks it, see docs). It keeps ``TrialPool``'s interface (``submit``,
``wait``, ``run_one``, ``free_slots``, ``busy``, ``close``) so the stages run unchanged;
trials go through the trial function it is given (``infrarsi.harness.launcher.run_process_trial``
unless told otherwise). There is no actor to lose, so nothing is retried here; the trial
inherits this process's view of the devices (``CUDA_VISIBLE_DEVICES``) instead of Ray's pinning.
"""

from __future__ import annotations

from collections import deque
from typing import Callable

from infrarsi.core.trial import TrialResult
from infrarsi.harness.launcher import TrialRequest, run_process_trial

__all__ = ["InProcessPool"]


class InProcessPool:
    num_slots = 1

    def __init__(self, run_trial: Callable[[TrialRequest], TrialResult] = run_process_trial) -> None:
        self._run_trial = run_trial
        self._queue: deque[TrialRequest] = deque()

    @property
    def free_slots(self) -> int:
        return 0 if self._queue else 1

    @property
    def busy(self) -> bool:
        return bool(self._queue)

    def submit(self, req: TrialRequest) -> None:
        assert not self._queue, "submit() needs a free slot"
        self._queue.append(req)

    def wait(self, timeout_s: float | None = None) -> list[TrialResult]:
        """Run the submitted trial to its end (``timeout_s`` is not needed: it blocks)."""
        return [self._run_trial(self._queue.popleft())] if self._queue else []

    def run_one(self, req: TrialRequest) -> list[TrialResult]:
        return [self._run_trial(req)]

    def close(self) -> None:
        self._queue.clear()
