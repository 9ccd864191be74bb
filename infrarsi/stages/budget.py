"""How many trials a campaign may run, stage by stage: one cap that every stage respects.

A *trial* is one config measured once: the attempts of a trial that a loaded machine made
the harness measure again, or that a lost Ray actor cut short, are the same trial. The
cap is ``budget.max_trials``; unset, it is what the protocol plans at most: doctor's
baseline runs and calibration (every class reference and every honest split in each
class), the search, and verification at its longest (``verify_pairs`` rounds, or
``minimize_pairs`` where more, of the baseline, a reference per numerics class, the
finalists, a smaller config and one leave-one-out, plus one round's worth of the honest
splits a canary check may need).
Before each trial the runtime checks the cap (``TrialBudgetExhausted`` past it), the
search stops early enough to leave verification its reserve (``infrarsi.stages.run.reserve``),
and verification plans its rounds within what is left. So the progress bar's total, the
cap, is the most trials the campaign can run.
"""

from __future__ import annotations

from typing import Iterable

from infrarsi.contract.numerics import campaign_changing_knobs, class_of, feasible_classes
from infrarsi.core.errors import InfrarsiError
from infrarsi.core.options import CampaignOptions
from infrarsi.core.spec import CampaignSpec
from infrarsi.core.trial import Role, TrialResult
from infrarsi.core.workspace import CampaignDir


class TrialBudgetExhausted(InfrarsiError):
    """A stage asked for a trial past ``budget.max_trials``."""


def classes_and_splits(spec: CampaignSpec) -> tuple[int, int, int]:
    """(numerics classes other than the baseline's, honest splits in the baseline's numerics,
    those of them doctor adds itself where the calibration has none: ``added_splits``)."""
    knobs = campaign_changing_knobs(spec)
    baseline = spec.space.validate(spec.baseline)
    others = len([c for c in feasible_classes(spec.space, baseline, knobs) if c])
    splits = sum(1 for v in spec.calibration if not class_of({**baseline, **v}, baseline, knobs))
    added = 2 if not splits and spec.fixed_products else 0
    return others, splits + added, added


def doctor_trials(spec: CampaignSpec) -> int:
    """The most trials doctor runs: baseline repeats, calibration variants (and the splits
    doctor adds), and per other numerics class its reference and the honest splits in it."""
    b = spec.budget
    others, splits, added = classes_and_splits(spec)
    return max(b.doctor_repeats, b.doctor_max_repeats) + len(spec.calibration) + added + others * (1 + splits)


def trial_cap(spec: CampaignSpec, num_trials: int) -> int:
    """``budget.max_trials``, or the protocol's plan at most for ``num_trials`` search trials."""
    if spec.budget.max_trials is not None:
        return spec.budget.max_trials
    b = spec.budget
    others, splits, _ = classes_and_splits(spec)
    arms = b.num_finalists + (2 if b.minimize_pairs else 0)
    rounds = max(b.verify_pairs, b.minimize_pairs)  # a leave-one-out arm may run past the finalists
    verify = rounds * (1 + others + arms) + others * splits
    return doctor_trials(spec) + num_trials + verify


def campaign_cap(spec: CampaignSpec, options: CampaignOptions) -> int:
    """The trial cap of a campaign run with ``options``: every caller's, so that the
    runtime, the progress bar and the report agree."""
    return trial_cap(spec, options.search_budget(spec))


def recorded_cap(spec: CampaignSpec, cdir: CampaignDir) -> int:
    """The trial cap of the campaign in ``cdir``, with the options it remembers."""
    return campaign_cap(spec, CampaignOptions().resumed(cdir))


STAGES = ("doctor", "search", "verification", "minimization")


def stage_of(role: Role, job_seed: int | None) -> str:
    """The stage that ran a trial of ``role``: calibration at a canary seed is verification's."""
    if role in (Role.DOCTOR, Role.CALIBRATE):
        return "doctor" if role is Role.DOCTOR or job_seed is None else "verification"
    if role is Role.SEARCH:
        return "search"
    return "minimization" if role is Role.MINIMIZE else "verification"


def trials_by_stage(trials: Iterable[TrialResult]) -> dict[str, int]:
    """Trials (final attempts) each stage ran."""
    counts = dict.fromkeys(STAGES, 0)
    for t in trials:
        if not t.extra.get("retried"):
            counts[stage_of(t.role, t.extra.get("job_seed"))] += 1
    return counts
