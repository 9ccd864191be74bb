"""Verification's reserve of the campaign's trial cap (``infrarsi.stages.budget``), and the
search's share of what doctor leaves: the search stops early enough that verification can
still run its fewest pairs of the leader."""

from __future__ import annotations

from infrarsi.core.errors import SpecError
from infrarsi.core.spec import CampaignSpec
from infrarsi.stages.budget import classes_and_splits, doctor_trials, trial_cap
from infrarsi.stages.run.sequential import SequentialRule


def verification_reserve(spec: CampaignSpec) -> int:
    """The trials verification needs to promote anything: the fewest pairs of the leader,
    each round with its baseline run and a reference for the leader's numerics."""
    others, _, _ = classes_and_splits(spec)
    return SequentialRule(max_pairs=spec.budget.verify_pairs).min_pairs * (2 + min(others, 1))


def search_trials(spec: CampaignSpec, num_trials: int, doctor_used: int, cap: int | None = None) -> int:
    """The search's share: ``num_trials``, less what the cap (``cap``, else the spec's for
    ``num_trials``) leaves after doctor's ``doctor_used`` trials and verification's reserve."""
    cap = trial_cap(spec, num_trials) if cap is None else cap
    return max(0, min(num_trials, cap - doctor_used - verification_reserve(spec)))


def check_cap(spec: CampaignSpec, num_trials: int) -> None:
    """Refuse a cap that leaves no search trial after doctor and verification's reserve."""
    cap, least = trial_cap(spec, num_trials), doctor_trials(spec) + verification_reserve(spec) + 1
    if cap < least:
        raise SpecError(f"budget.max_trials = {cap} leaves no search trial: doctor runs up to "
                        f"{doctor_trials(spec)} trials and verification needs at least {verification_reserve(spec)}; "
                        f"set max_trials to at least {least} (or fewer doctor_max_repeats / calibration variants)")
