"""Uniform random search over the feasible space: the floor every strategy must beat."""

from __future__ import annotations

from infrarsi.core.knobs import Config
from infrarsi.proposers.base import Proposer


class RandomProposer(Proposer):
    name = "random"

    def _propose(self, num_configs: int) -> list[Config]:
        return self.space.sample(self.rng, num_configs, exclude=self._seen)
