"""doctor's half of the loss contract: measure each numerics class's reference and tolerance.

- The baseline's own numerics: the tolerance is ``TOLERANCE_MARGIN`` times the largest
  score (mean or trend of the relative deviation, ``loss_reference.Deviation``) of the repeated
  baseline runs and of the calibration variants that keep the numerics (honest splits of
  the global batch), never below ``contract.min_loss_tolerance``: near-exact where the job
  is deterministic up to reordering.
- Every other numerics class a feasible config can fall in (e.g. ``precision=bf16``):
  the baseline run in that class is its reference. Its tolerance is ``TOLERANCE_MARGIN``
  times the largest of the scores of the honest splits run in that class (every split of
  the calibration) and of its reference against the baseline: one split alone is a poor
  estimate of rounding noise (honest bf16 splits of one job scored 1e-4 to 7e-4), and a
  precision change moves the loss about as far as its own noise does. Never below the
  baseline class's tolerance.
- The claim of ``contract.loss_signal`` is checked on the honest splits: a per-step loss
  that moves by more than ``SPLIT_CLAIM_LIMIT`` under an honest split is not a function of
  the global batch, and doctor stops with what to set instead.

Verification's loss check at its canary seeds (``stages.canary``) uses these classes and
references too, and the evidence plan and minimization read the settings calibration
found inert (``inert_knobs``).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from typing import Any, Callable, Sequence

from scipy import stats

from infrarsi.backends import backend_of
from infrarsi.contract.checks import enforce
from infrarsi.contract.loss_contract import ClassReference, LossContract
from infrarsi.contract.loss_reference import LossReference
from infrarsi.contract.numerics import (
    NumericsClass,
    campaign_changing_knobs,
    class_config,
    class_of,
    describe,
    feasible_classes,
)
from infrarsi.core.errors import ContractError
from infrarsi.core.knobs import Config, Value
from infrarsi.core.trial import Outcome, Role, TrialResult
from infrarsi.stages.runtime import CampaignRuntime

# An honest run's score, times this, is the tolerance: candidates run once, so the bound
# must sit clearly above what legitimate changes do.
TOLERANCE_MARGIN = 2.0
# An honest split that moves the compared signal by more than this means the signal is not
# a deterministic function of the global batch (a job reporting its last micro-batch's
# loss moved 3-9% per step); below it, the split's own reordering noise is what it shows.
SPLIT_CLAIM_LIMIT = 0.01
MAX_CLASSES = 8  # numerics classes doctor measures a reference for


def loss_score(ref: TrialResult, run: TrialResult, signal: str, window: int, quantum: float = 0.0) -> float:
    """How far ``run``'s losses lie from ``ref``'s on the contract's signal (0: identical, or
    apart by no more than the printed unit ``quantum``)."""
    reference = LossReference(losses=ref.losses, eval_losses=ref.eval_losses, tolerance=float("inf"),
                              signal=signal, window=window, quantum=quantum)
    return reference.compare(run.losses, run.eval_losses).score


def calibrate_loss(rt: CampaignRuntime, runs: list[TrialResult], recorded: dict[tuple, TrialResult] | None = None,
                   ) -> tuple[LossContract, list[dict[str, Any]]]:
    """The loss contract and the calibration table (one row per run doctor compared).
    ``recorded``: calibration runs already in the ledger, by sorted config items (a resumed
    doctor reuses them instead of running them again)."""
    recorded = recorded or {}

    def _run(rt: CampaignRuntime, config: Config) -> TrialResult:
        key = tuple(sorted(rt.space.validate(config).items()))
        if key not in recorded:
            recorded[key] = rt.run_one(config, Role.CALIBRATE, check=lambda t: enforce(t, rt.spec.contract, None))
        return recorded[key]

    spec, contract = rt.spec, rt.spec.contract
    signal, window = contract.loss_signal, contract.loss_window
    baseline = rt.space.validate(spec.baseline)
    knobs = campaign_changing_knobs(spec)
    base = runs[0]
    if signal == "eval" and not base.eval_losses and backend_of(spec).runs_code:
        raise ContractError("contract.loss_signal = \"eval\" but the baseline reported no eval losses; make the "
                            "job report `eval` events (eval_loss), or choose loss_signal \"step\" or \"window\"")
    legacy = LossReference(losses=base.losses, tolerance=float("inf"))
    printed = printed_units(runs)
    quantum = printed[1] if signal == "eval" else printed[0]
    scores = [loss_score(base, r, signal, window, quantum) for r in runs]
    rows: list[dict[str, Any]] = [{"config": "baseline repeats", "class": describe(()),
                                   "deviation": max(abs(legacy.deviation(r.losses)[0]) for r in runs),
                                   "score": max(scores)}]
    splits: list[tuple[dict, float]] = []  # honest splits in the baseline's numerics
    class_runs: dict[NumericsClass, TrialResult] = {}
    warnings: list[str] | None = None
    variants = [*spec.calibration, *added_splits(rt, baseline, knobs)]
    # Splits first: a refuted signal claim stops doctor before the other numerics run.
    for variant in sorted(variants, key=lambda v: bool(class_of({**baseline, **v}, baseline, knobs))):
        cfg = {**baseline, **variant}
        cls = class_of(cfg, baseline, knobs)
        if cls and warnings is None:
            warnings = _check_claim(signal, window, splits)
        r = _run(rt, cfg)
        ok = r.outcome is Outcome.OK
        score = loss_score(base, r, signal, window, quantum) if ok else None
        rows.append({"config": variant, "class": describe(cls), "outcome": r.outcome.value, "trial_id": r.trial_id,
                     "deviation": legacy.deviation(r.losses)[0] if ok else None, "score": score})
        if ok and not cls:
            splits.append((variant, score))
        elif ok and cfg == class_config(baseline, cls):
            class_runs[cls] = r
    keeps_tol = max([contract.min_loss_tolerance] + [TOLERANCE_MARGIN * s for s in scores + [s for _, s in splits]])
    warnings = _check_claim(signal, window, splits) if warnings is None else warnings
    classes = [ClassReference(settings=(), losses=base.losses, eval_losses=base.eval_losses, tolerance=keeps_tol,
                              trial_ids=tuple(r.trial_id for r in runs), honest_score=max(scores + [s for _, s in splits]))]
    for cls in _classes(rt, baseline, knobs):
        ref, row_list = _class_reference(rt, _run, cls, base, class_runs.get(cls), [v for v, _ in splits], keeps_tol,
                                          quantum)
        classes.append(ref)
        rows += row_list
    if contract.loss_tolerance is not None:
        classes = [dataclasses.replace(c, tolerance=contract.loss_tolerance) for c in classes]
    return LossContract(signal=signal, window=window, baseline=baseline, changing_knobs=knobs,
                        classes=tuple(classes), warnings=tuple(warnings), splits=tuple(v for v, _ in splits),
                        loss_quantum=printed[0], eval_loss_quantum=printed[1]), rows


def printed_units(runs: Sequence[TrialResult]) -> tuple[float, float]:
    """(loss, eval loss): the largest unit of the last digit the baseline runs printed, 0
    where the job reports at full precision."""
    return (max((r.loss_quantum or 0.0 for r in runs), default=0.0),
            max((r.eval_loss_quantum or 0.0 for r in runs), default=0.0))


def _classes(rt: CampaignRuntime, baseline: Config, knobs: tuple[str, ...]) -> list[NumericsClass]:
    classes = [c for c in feasible_classes(rt.space, baseline, knobs) if c]
    if len(classes) > MAX_CLASSES:
        raise ContractError(
            f"the knobs that change the numerics ({list(knobs)}) make {len(classes)} numerics classes, each "
            f"needing a reference run; at most {MAX_CLASSES} are measured. Narrow their values, or declare "
            "a knob `numerics = \"keeps\"` where its values compute the same numbers")
    return classes


def _class_reference(rt: CampaignRuntime, run: Callable[[CampaignRuntime, Config], TrialResult], cls: NumericsClass,
                     base: TrialResult, ref: TrialResult | None, split_variants: list[dict],
                     keeps_tol: float, quantum: float) -> tuple[ClassReference, list[dict[str, Any]]]:
    """Class ``cls``'s reference run (reused from the calibration variants where one is
    it) and its tolerance, from the honest splits run in the same numerics."""
    signal, window = rt.spec.contract.loss_signal, rt.spec.contract.loss_window
    cfg = class_config(rt.space.validate(rt.spec.baseline), cls)
    reused, ref = ref is not None, ref or run(rt, cfg)
    ok = ref.outcome is Outcome.OK
    scores = [loss_score(base, ref, signal, window, quantum)] if ok else []
    rows = [] if reused else [{"config": dict(cls), "class": describe(cls), "outcome": ref.outcome.value,
                               "trial_id": ref.trial_id, "deviation": None, "score": scores[0] if ok else None,
                               "role": "class reference"}]
    if not ok:
        return ClassReference(settings=cls, losses=(), tolerance=keeps_tol, trial_ids=(ref.trial_id,),
                              failure=f"{ref.outcome.value}: {ref.reason}"), rows
    trial_ids = [ref.trial_id]
    for variant in split_variants:
        split_cfg = {**cfg, **variant}
        if not rt.space.is_feasible(split_cfg):
            continue
        split = run(rt, split_cfg)
        score = loss_score(ref, split, signal, window, quantum) if split.outcome is Outcome.OK else None
        rows.append({"config": {**dict(cls), **variant}, "class": describe(cls), "outcome": split.outcome.value,
                     "trial_id": split.trial_id, "deviation": None, "score": score, "role": "honest split in class"})
        trial_ids.append(split.trial_id)
        if score is not None:
            scores.append(score)
    return ClassReference(settings=cls, losses=ref.losses, eval_losses=ref.eval_losses,
                          tolerance=max([keeps_tol] + [TOLERANCE_MARGIN * s for s in scores]),
                          trial_ids=tuple(trial_ids), honest_score=max(scores)), rows


def added_splits(rt: CampaignRuntime, baseline: Config, knobs: tuple[str, ...]) -> list[dict[str, Any]]:
    """Honest splits doctor runs itself where the spec's calibration has none in the
    baseline's numerics: a loss signal checked only against the baseline's own repeats
    would reject every honest split of the batch. The two extremes of the first fixed
    product's feasible splits (the tolerance must cover every split between them)."""
    spec = rt.spec
    if not spec.fixed_products or any(not class_of({**baseline, **v}, baseline, knobs) for v in spec.calibration):
        return []
    names = spec.fixed_products[0].knobs
    splits = sorted({tuple(c[n] for n in names) for c in rt.space.feasible
                     if all(c[k] == baseline[k] for k in c if k not in names)} - {tuple(baseline[n] for n in names)})
    return [dict(zip(names, s)) for s in splits[:1] + splits[1:][-1:]]


def _check_claim(signal: str, window: int, splits: list[tuple[dict, float]]) -> list[str]:
    """Whether the honest splits bear out the spec's loss signal; raises where they refute it."""
    if not splits:
        return [f"no calibration variant keeps the numerics (e.g. another micro-batch split), so the claim "
                f"loss_signal = {signal!r} was not checked; add one to `calibration`"]
    variant, worst = max(splits, key=lambda vs: vs[1])
    if worst <= SPLIT_CLAIM_LIMIT:
        return []
    what = {"step": "the per-step loss", "window": f"the {window}-step mean loss", "eval": "the eval loss"}[signal]
    message = (f"the honest split {variant} moved {what} by {worst:.2%} (mean or trend of the relative deviation; "
               f"limit {SPLIT_CLAIM_LIMIT:.0%}), so it is not a deterministic function of the global batch")
    if signal == "step":
        raise ContractError(message + ". Set contract.loss_signal = \"window\" (a moving mean over "
                            "contract.loss_window steps) or \"eval\" (the eval loss the job reports), "
                            "e.g. for a job that reports its last micro-batch's loss")
    if signal == "eval":
        raise ContractError(message + ". An eval loss computed on fixed held-out data depends only on the "
                            "weights: check that the job evaluates the same batches in every config")
    return [message + "; the check cannot tell changes of that size from honest ones. A longer "
            "contract.loss_window or loss_signal = \"eval\" compares more closely"]



def inert_knobs(doctor: Any, trials: Sequence[TrialResult], margin: float) -> dict[str, Value]:
    """Knob settings doctor's calibration ran alone (one knob off the baseline) that moved
    neither the losses nor the speed, whatever their numerics class: {knob: value}.

    Losses: no further from the reference than the baseline's own repeats are (bit-identical
    where the job is deterministic: a ``dtype`` a CPU job ignores). Speed: the variant's step
    time inside the 95% prediction interval of one more warm baseline run (and never held
    closer than the practical margin): one run cannot show a speed unmoved, but identical
    losses say the job computed the same thing, and a run the baseline's own runs would have
    produced says it did not get measurably faster doing it. Minimization still keeps such a
    change where the rounds show the config without it slower.
    """
    by_id = {t.trial_id: t for t in trials if not t.extra.get("retried")}
    reference = tuple(doctor.reference_losses)
    repeats = [by_id[i] for i in doctor.trial_ids if i in by_id and by_id[i].outcome is Outcome.OK]
    spread = max((_loss_gap(r.losses, reference) for r in repeats), default=0.0)
    times = [math.log(t) for t in doctor.run_step_times_s if t and t > 0]
    if not reference or len(times) < 2:
        return {}
    half = max(stats.t.ppf(0.975, len(times) - 1) * statistics.stdev(times) * math.sqrt(1 + 1 / len(times)),
               math.log1p(margin))
    center = statistics.fmean(times)
    out: dict[str, Value] = {}
    for t in by_id.values():
        if t.role is not Role.CALIBRATE or t.extra.get("job_seed") is not None or t.outcome is not Outcome.OK:
            continue
        changed = {k: v for k, v in t.config.items() if doctor.baseline.get(k, False) != v}
        if len(changed) == 1 and _loss_gap(t.losses, reference) <= spread \
                and abs(math.log(t.step_time_s) - center) <= half:
            out.update(changed)
    return out


def _loss_gap(losses: Sequence[float], reference: Sequence[float]) -> float:
    """The largest relative difference step by step (inf where the lengths differ)."""
    if len(losses) != len(reference) or not reference:
        return float("inf")
    return max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(losses, reference))
