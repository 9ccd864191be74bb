"""Search strategies behind one interface; ``make_proposer(name, ctx)`` builds one."""

from __future__ import annotations

from infrarsi.core.errors import SpecError
from infrarsi.proposers.base import Proposer, SearchContext


def _registry() -> dict[str, type[Proposer]]:
    from infrarsi.proposers.engine_proposer import InfraRSIProposer
    from infrarsi.proposers.greedy import GreedyProposer
    from infrarsi.proposers.optuna_samplers import GPProposer, TPEProposer
    from infrarsi.proposers.random import RandomProposer

    classes: list[type[Proposer]] = [RandomProposer, TPEProposer, GPProposer, GreedyProposer, InfraRSIProposer]
    return {c.name: c for c in classes}


def proposer_names() -> list[str]:
    return sorted(_registry())


def make_proposer(name: str, ctx: SearchContext) -> Proposer:
    registry = _registry()
    if name not in registry:
        raise SpecError(f"unknown proposer {name!r}; choose one of {sorted(registry)}")
    return registry[name](ctx)


__all__ = ["Proposer", "SearchContext", "make_proposer", "proposer_names"]
