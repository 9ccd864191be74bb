"""Priors on what each knob setting does to step time and peak memory (and, where the
experience bank knows it, to a trial's wall time).

Effects are on the log scale and relative to the *baseline's* value of the same knob
(the baseline setting has effect 0): ``log_time_mean = log(0.8)`` says "this setting is
expected to make a step 20% faster than the baseline's setting". Sources: built-in
tables (``infrarsi.engine.builtin_priors``), an LLM (``infrarsi.adapters.llm``), the
experience bank. The engine turns them into the Bayesian models' prior means/variances and,
after a campaign, compares them with the posterior (prior revision).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable, Mapping

from infrarsi.core.knobs import Value

# Without information a setting may plausibly halve or double time or memory (±2 sd).
UNINFORMED_LOG_STD = math.log(2.0)


@dataclass(frozen=True, kw_only=True)
class SettingPrior:
    knob: str
    value: Value
    log_time_mean: float = 0.0
    log_time_std: float = UNINFORMED_LOG_STD
    log_memory_mean: float = 0.0
    log_memory_std: float = UNINFORMED_LOG_STD
    # What the setting does to a trial's wall time (start-up, compiling included, plus its
    # steps): only the experience bank knows it, from past campaigns' cost models.
    log_cost_mean: float = 0.0
    log_cost_std: float = UNINFORMED_LOG_STD
    source: str = "uninformed"
    rationale: str = ""

    def __post_init__(self) -> None:
        for name in ("log_time_std", "log_memory_std", "log_cost_std"):
            if not getattr(self, name) > 0:
                raise ValueError(f"prior {self.knob}={self.value!r}: {name} must be > 0, got {getattr(self, name)}")


@dataclass(frozen=True)
class Priors:
    settings: Mapping[tuple[str, Value], SettingPrior] = field(default_factory=dict)
    source: str = "uninformed"

    @classmethod
    def of(cls, items: Iterable[SettingPrior], source: str) -> "Priors":
        return cls({(p.knob, p.value): p for p in items}, source)

    def get(self, knob: str, value: Value) -> SettingPrior:
        return self.settings.get((knob, value)) or SettingPrior(knob=knob, value=value)

    def merged_over(self, base: "Priors") -> "Priors":
        """These priors where given, ``base`` elsewhere."""
        return Priors({**base.settings, **self.settings}, f"{self.source}+{base.source}")

    def trial_cost(self) -> "Priors":
        """The cost priors in the time fields, for the engine's trial-cost model (a
        ``TimeModel`` of log wall time): uninformed wherever no source knew the cost."""
        return Priors({key: SettingPrior(knob=p.knob, value=p.value, log_time_mean=p.log_cost_mean,
                                         log_time_std=p.log_cost_std, source=p.source, rationale=p.rationale)
                       for key, p in self.settings.items()}, f"{self.source} (trial cost)")
