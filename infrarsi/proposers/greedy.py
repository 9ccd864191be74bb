"""Greedy coordinate descent from the baseline: the single-incumbent climber.

It tries one-knob changes of the incumbent (the fastest ok config so far, the baseline
until something beats it) and moves when one is faster. When the incumbent's neighbourhood
is exhausted it is stuck in a local optimum; it then tries neighbours of the next-best ok
configs, and finally random configs, so it only runs dry when the space does.
"""

from __future__ import annotations

from infrarsi.core.knobs import Config
from infrarsi.core.trial import Outcome
from infrarsi.proposers.base import Proposer


class GreedyProposer(Proposer):
    name = "greedy"

    def _propose(self, num_configs: int) -> list[Config]:
        ok = sorted((r for r in self.history if r.outcome is Outcome.OK), key=lambda r: r.step_time_s)
        out: list[Config] = []
        taken = set(self._seen)
        if self.space.key(self.ctx.baseline) not in taken and self.space.is_feasible(self.ctx.baseline):
            out.append(dict(self.ctx.baseline))
            taken.add(self.space.key(self.ctx.baseline))
        # Incumbent first; the baseline stands in while nothing has run ok.
        centres = [r.config for r in ok] or [self.ctx.baseline]
        for centre in centres:
            for cand in self.space.neighbours(centre):
                if len(out) >= num_configs:
                    return out
                if self.space.key(cand) not in taken:
                    out.append(cand)
                    taken.add(self.space.key(cand))
        return out + self.space.sample(self.rng, num_configs - len(out), exclude=taken)
