"""Verification's loss check at its canary seeds: each arm against a run of its own
numerics class's reference at a seed the search never used, at the tolerance doctor's
calibration (``stages.calibration``) set, or at that seed's own honest spread where it is
wider."""

from __future__ import annotations

import dataclasses
from typing import Callable

from infrarsi.contract.checks import enforce
from infrarsi.contract.loss_contract import LossContract
from infrarsi.contract.numerics import NumericsClass, describe
from infrarsi.core.knobs import Config
from infrarsi.core.spec import ContractSpec
from infrarsi.core.trial import Outcome, Role, TrialResult
from infrarsi.stages.budget import TrialBudgetExhausted
from infrarsi.stages.calibration import TOLERANCE_MARGIN, loss_score
from infrarsi.stages.runtime import CampaignRuntime


def canary_loss_check(contract: ContractSpec, loss_contract: LossContract, baseline_run: TrialResult, seed: int,
                      configs: list[Config], run_reference: Callable[[Config], TrialResult],
                      run_split: Callable[[Config], TrialResult | None] | None = None,
                      ) -> Callable[[TrialResult], TrialResult]:
    """The loss check at a canary seed: each candidate against a run of its own numerics
    class's reference config at that seed (the baseline run for the baseline's numerics;
    the others run here with ``run_reference``, once per class among ``configs``), at the
    class's tolerance. Verification checks every arm of its plan with it; minimization runs
    no trial and reads the arms verification checked.

    How far an honest change moves the loss depends on the seed: at one canary seed of the
    built-in debug job a loss spike amplified the honest splits' fp32 deviation from ~5e-8
    to 1.5e-5, five times the tolerance calibrated at the contract seed. So a candidate
    whose loss breaks the class's tolerance is judged again at this seed's own honest
    spread: doctor's honest splits run here in its class (``run_split``, once per class
    and seed, only when needed) and the tolerance rises to ``TOLERANCE_MARGIN`` times their
    largest deviation from the reference run, never below the calibrated one."""
    runs = {(): baseline_run}
    for cfg in configs:
        cls = loss_contract.class_of(cfg)
        ref = loss_contract.reference_of(cls)
        if cls not in runs and ref is not None and not ref.failure:
            runs[cls] = run_reference(loss_contract.reference_config(cls))
    spread: dict[NumericsClass, tuple[float, list[str]]] = {}

    def seed_spread(cls: NumericsClass, ref_run: TrialResult) -> tuple[float, list[str]]:
        """The largest deviation of the honest splits at this seed, and their trial ids."""
        if cls not in spread:
            found, ids = [], []
            for variant in loss_contract.splits if run_split else ():
                cfg = {**loss_contract.reference_config(cls), **variant}
                r = run_split(cfg)  # None where the split is infeasible in this class
                ids += [r.trial_id] if r else []
                if r and r.outcome is Outcome.OK:
                    found.append(loss_score(ref_run, r, loss_contract.signal, loss_contract.window,
                                            loss_contract.quantum))
            spread[cls] = max(found, default=0.0), ids
        return spread[cls]

    def check(result: TrialResult) -> TrialResult:
        cls = loss_contract.class_of(result.config)
        ref_run = runs.get(cls)
        if ref_run is None or ref_run.outcome is not Outcome.OK:
            checked = enforce(result, contract, loss_contract if ref_run is None else None)
            if ref_run is None or checked.outcome is not Outcome.OK or not cls:
                return checked  # the baseline's own failure fails the pair in the verdict
            return checked.replace(outcome=Outcome.CONTRACT_VIOLATION,
                                   reason=f"its reference in {describe(cls)} failed at canary seed {seed} "
                                          f"({ref_run.trial_id}): the loss could not be checked")
        name = "the baseline" if not cls else f"the {describe(cls)} reference"
        reference = loss_contract.reference(cls, ref_run.losses, ref_run.eval_losses,
                                            f"{name} at canary seed {seed} ({ref_run.trial_id})")
        checked = enforce(result, contract, reference)
        if checked.outcome is not Outcome.CONTRACT_VIOLATION or not reference.problems(result):
            return checked
        worst, ids = seed_spread(cls, ref_run)
        if TOLERANCE_MARGIN * worst <= reference.tolerance:
            return checked
        at_seed = dataclasses.replace(reference, tolerance=TOLERANCE_MARGIN * worst, name=(
            f"{reference.name}, whose honest splits at this seed ({', '.join(ids)}) moved it by up to {worst:.2e}"))
        again = enforce(result, contract, at_seed)
        return again.replace(extra={**again.extra, "loss_tolerance_at_seed": at_seed.tolerance,
                                    "seed_splits": ids})

    return check


def canary_split_runner(rt: CampaignRuntime, seed: int,
                        run_trial: Callable[..., TrialResult] | None = None) -> Callable[[Config], TrialResult | None]:
    """``canary_loss_check``'s ``run_split``: an honest split at a canary seed, recorded as
    a calibration run (``run_trial(config, role, seed, check)``: verification's, which takes
    a resumed campaign's recorded run back). None where the split is infeasible, or where
    the campaign's trial cap allows no more trials (the calibrated tolerance then stands)."""
    def run(cfg: Config) -> TrialResult | None:
        # A patch accepted during the run is a knob the doctor's baseline lacks: it is off.
        if not rt.space.is_feasible({**dict.fromkeys(rt.space.names, False), **cfg}):
            return None
        check = lambda t: enforce(t, rt.spec.contract, None)  # noqa: E731
        try:
            if run_trial is not None:
                return run_trial(cfg, Role.CALIBRATE, seed, check)
            return rt.run_one(cfg, Role.CALIBRATE, seed=seed, check=check)
        except TrialBudgetExhausted:
            return None
    return run
