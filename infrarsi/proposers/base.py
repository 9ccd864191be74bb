"""The proposer interface every search strategy implements.

Lifecycle: the run stage builds one proposer per campaign from a ``SearchContext``, then
alternates ``suggest(n)`` (a batch of up to ``n`` new feasible configs, for ``n`` parallel
trial slots) and ``observe(result)`` (one finished trial of any outcome, OOMs and crashes
included, in completion order). A resumed campaign replays its ledger through
``observe`` before asking again, so a proposer must be rebuildable from its history.

Contract (checked for every proposer by ``tests/test_proposer_contract.py``):
- the same seed and the same observations give the same suggestions;
- every suggestion is feasible and was never suggested or observed before;
- an empty list means the space is exhausted;
- histories of only OOMs or only crashes are handled without error.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from infrarsi.core.knobs import Config, KnobSpace
from infrarsi.core.trial import TrialResult


@dataclass(frozen=True, kw_only=True)
class SearchContext:
    space: KnobSpace
    baseline: Config
    memory_capacity_bytes: int | None = None
    seed: int = 0
    # Configs worth trying first: from the experience bank of similar workloads/hardware.
    experience_configs: tuple[Config, ...] = ()
    # Per-knob-setting priors on time and memory (the engine reads them; others may ignore).
    priors: Any = None
    # Trials run without an accelerator (the built-in priors hold a few CPU-specific levels).
    on_cpu: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


class Proposer(abc.ABC):
    name: ClassVar[str]

    def __init__(self, ctx: SearchContext) -> None:
        self.ctx = ctx
        self.space = ctx.space
        self.rng = np.random.default_rng(ctx.seed)
        self.history: list[TrialResult] = []
        self._seen: set[tuple] = set()

    def suggest(self, num_configs: int) -> list[Config]:
        """Up to ``num_configs`` new, distinct, feasible configs."""
        out: list[Config] = []
        for cfg in self._propose(num_configs):
            key = self.space.key(cfg)
            if key in self._seen or not self.space.is_feasible(cfg):
                continue
            self._seen.add(key)
            out.append(dict(cfg))
            if len(out) == num_configs:
                break
        return out

    def observe(self, result: TrialResult) -> None:
        self._seen.add(self.space.key(result.config))
        self.history.append(result)
        self._observe(result)

    @abc.abstractmethod
    def _propose(self, num_configs: int) -> list[Config]:
        """Candidate configs, best first; ``suggest`` drops seen or infeasible ones."""

    def _observe(self, result: TrialResult) -> None:  # noqa: B027 - optional hook
        """Update internal state from one finished trial."""

    def describe(self) -> dict[str, Any]:
        """What the proposer learned, for the report (models, prices, priors)."""
        return {}
