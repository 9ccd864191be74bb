"""run (minimization, after verification): promote the smallest change that pays.

The verified winner changes several knobs from the baseline; some may do nothing for the
user (a precision knob a CPU job ignores, a compile whose start-up a short job never
repays). Leave-one-out, measured in the verification's own protocol: each round runs the
baseline, the winner, and the winner less each one change, at a canary seed of its own,
every run loss-checked against that round's baseline. A change's contribution is the
paired ratio of the objective (infrarsi.objective: step time, or the whole job's time)
without it over with it; a change whose contribution is within the noise floor does not
pay. Dropping one such change promotes the winner less it (already measured against the
baseline); dropping several promotes their joint removal only after it too is measured,
interleaved with the baseline and the winner, and found within noise of the winner.

Cost: ``budget.minimize_pairs`` rounds of (2 + one per change that can be left out
alone) trials, plus as many rounds of 3 when two or more changes are dropped together;
nothing when the winner changes one knob. Every run is a ledger line, and a resumed
campaign replays them in order instead of running them again.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any, Mapping

from infrarsi.checks import LossReference, enforce
from infrarsi.loss_calibration import canary_loss_check, canary_split_runner
from infrarsi.loss_contract import LossContract
from infrarsi.knobs import Config, Value
from infrarsi.objective import job_steps, run_time_s
from infrarsi.runtime import CampaignRuntime
from infrarsi.stages.doctor import DoctorReport
from infrarsi.stages.verify import VerificationReport, Verdict, paired_speedup, paired_verdict
from infrarsi.trial import Outcome, Role, TrialResult

SEED_OFFSET = 2000  # canary seeds of minimization rounds: contract seed + 2000 + round


@dataclass(frozen=True, kw_only=True)
class Contribution:
    """One change of the winner: how much slower the winner is without it (>1: it pays)."""

    knob: str
    baseline_value: Value
    value: Value
    contribution: float | None  # objective without the change / with it, geometric mean of pairs
    ci_low: float | None
    ci_high: float | None
    step_contribution: float | None  # the same on step time alone
    pairs: tuple[tuple[str, str], ...] = ()  # (winner run, run without the change)
    inert: bool = False  # doctor's calibration saw it move neither the loss nor the speed
    kept: bool = True
    note: str = ""


@dataclass(frozen=True, kw_only=True)
class MinimizeReport:
    winner: Mapping[str, Value]
    promoted: Mapping[str, Value] | None
    contributions: tuple[Contribution, ...]
    dropped: tuple[str, ...]
    noise_floor: float
    job_steps: float | None
    num_trials: int
    note: str
    final: VerificationReport  # what is promoted after minimization

    def to_json(self) -> dict[str, Any]:
        d = {k: v for k, v in asdict(self).items() if k != "final"}
        return {**d, "final": self.final.to_json()}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "MinimizeReport":
        contributions = tuple(Contribution(**{**c, "pairs": tuple(tuple(p) for p in c["pairs"])})
                              for c in d["contributions"])
        return cls(**{**d, "contributions": contributions, "dropped": tuple(d["dropped"]),
                      "final": VerificationReport.from_json(d["final"])})


class _Replay:
    """The stage's runs already in the ledger, handed back in the order they were run."""

    def __init__(self, rt: CampaignRuntime) -> None:
        self.rt = rt
        self.recorded = [t for t in rt.ledger.trials() if t.role in (Role.MINIMIZE, Role.MINIMIZE_BASELINE)
                         and not t.extra.get("retried")]
        self.num_run = 0

    def run(self, config: Config, role: Role, seed: int, check) -> TrialResult:
        self.num_run += 1
        if self.recorded and self.recorded[0].role is role and dict(self.recorded[0].config) == dict(config):
            return self.recorded.pop(0)
        self.recorded = []  # the plan diverged from what was recorded: run everything from here
        return self.rt.run_one(config, role, check=check, seed=seed)


def _rounds(rt: CampaignRuntime, doctor: DoctorReport, replay: _Replay, configs: list[Config],
            first_round: int) -> list[list[tuple[TrialResult, TrialResult]]]:
    """Per config, its (baseline run, run) of each round; every round at its own canary seed."""
    contract = rt.spec.contract
    out: list[list[tuple[TrialResult, TrialResult]]] = [[] for _ in configs]
    for i in range(first_round, first_round + rt.spec.budget.minimize_pairs):
        seed = contract.seed + SEED_OFFSET + i
        a = replay.run(doctor.baseline, Role.MINIMIZE_BASELINE, seed, lambda r: enforce(r, contract, None))
        losses = doctor.loss_reference
        if isinstance(losses, LossContract):  # each config against a run in its own numerics (issue 11)
            check = canary_loss_check(contract, losses, a, seed, configs, lambda cfg: replay.run(
                cfg, Role.MINIMIZE_BASELINE, seed, lambda r: enforce(r, contract, None)), canary_split_runner(rt, seed))
        else:
            ref = LossReference(losses=a.losses, tolerance=doctor.loss_tolerance,
                                name=f"the baseline at canary seed {seed} ({a.trial_id})")
            check = lambda r: enforce(r, contract, ref if a.outcome is Outcome.OK else None)  # noqa: E731
        for j, cfg in enumerate(configs):
            out[j].append((a, replay.run(cfg, Role.MINIMIZE, seed, check)))
    return out


def _ok_pairs(pairs: list[tuple[TrialResult, TrialResult]]) -> list[tuple[TrialResult, TrialResult]]:
    return [(a, b) for a, b in pairs if a.outcome is Outcome.OK and b.outcome is Outcome.OK]


def _problems(pairs: list[tuple[TrialResult, TrialResult]]) -> list[str]:
    return [f"{r.trial_id} ({r.role.value}) {r.outcome.value}: {r.reason}"
            for pair in pairs for r in pair if r.outcome is not Outcome.OK]


def _ratio(winner: list[tuple[TrialResult, TrialResult]], other: list[tuple[TrialResult, TrialResult]],
           steps: float | None) -> tuple[list[tuple[str, str]], tuple | None, tuple | None]:
    """Paired (objective, step) ratios of ``other`` over the winner, round by round."""
    both = [(w, o) for (_, w), (_, o) in zip(winner, other)
            if w.outcome is Outcome.OK and o.outcome is Outcome.OK]
    if len(both) < 2:
        return [(w.trial_id, o.trial_id) for w, o in both], None, None
    job = paired_speedup([run_time_s(o, steps) for _, o in both], [run_time_s(w, steps) for w, _ in both])
    step = paired_speedup([o.step_time_s for _, o in both], [w.step_time_s for w, _ in both])
    return [(w.trial_id, o.trial_id) for w, o in both], job, step


def inert_knobs(rt: CampaignRuntime, doctor: DoctorReport) -> dict[str, Value]:
    """Single-knob calibration variants that moved the loss no more than baseline repeats
    do and the step time no more than the noise: {knob: value}."""
    repeats = max((abs(r.get("deviation") or 0.0) for r in doctor.calibration
                   if r.get("config") == "baseline repeats"), default=0.0)
    times = {t.trial_id: t.step_time_s for t in rt.ledger.trials() if t.role is Role.CALIBRATE}
    out = {}
    for row in doctor.calibration:
        cfg, t = row.get("config"), times.get(row.get("trial_id"))
        if not isinstance(cfg, dict) or len(cfg) != 1 or row.get("deviation") is None or t is None:
            continue
        if abs(row["deviation"]) <= repeats and abs(t / doctor.step_time_s - 1) <= doctor.noise_cv:
            out.update(cfg)
    return out


def full_baseline(rt: CampaignRuntime, doctor: DoctorReport) -> dict[str, Value]:
    """Doctor's baseline with every knob of the space: a patch proposed during the run is
    a knob doctor never saw, and the baseline runs without it."""
    return {**{n: False for n in rt.space.names}, **doctor.baseline}


def _leave_one_out(rt: CampaignRuntime, doctor: DoctorReport, replay: _Replay, winner: Verdict,
                   changes: dict[str, Value], steps: float | None, floor: float
                   ) -> tuple[list[Contribution], dict[str, list]]:
    """Each change's contribution, and per config key the runs measured (for the verdicts)."""
    base, inert = full_baseline(rt, doctor), inert_knobs(rt, doctor)
    alone = {k: {**winner.config, k: base[k]} for k in changes}
    coupled = {k: rt.space.violated(cfg) for k, cfg in alone.items()}
    testable = [k for k in changes if not coupled[k]]
    runs = _rounds(rt, doctor, replay, [dict(winner.config)] + [alone[k] for k in testable], first_round=0)
    by_key = {"winner": runs[0], **{k: r for k, r in zip(testable, runs[1:])}}
    out = []
    for k, value in changes.items():
        common = dict(knob=k, baseline_value=base[k], value=value, inert=inert.get(k) == value)
        if coupled[k]:
            out.append(Contribution(**common, contribution=None, ci_low=None, ci_high=None, step_contribution=None,
                                    note=f"not left out alone: that breaks {coupled[k]}"))
            continue
        pairs, job, step = _ratio(by_key["winner"], by_key[k], steps)
        # A run without the change that failed where the winner's own run of the round did
        # not: the change is what keeps the config running (or within the contract). A
        # round whose winner run failed too says nothing about the change.
        failed = [b for (_, w), (_, b) in zip(by_key["winner"], by_key[k])
                  if w.outcome is Outcome.OK and b.outcome is not Outcome.OK]
        if job is None:
            why = f"without it: {failed[0].outcome.value} ({failed[0].reason[:120]})" if failed else "too few pairs"
            out.append(Contribution(**common, contribution=None, ci_low=None, ci_high=None, step_contribution=None,
                                    pairs=tuple(pairs), note=why))
            continue
        faster = job[0] > 1.0 + floor
        pays = faster or bool(failed)
        note = ("" if faster else
                f"kept: {len(failed)} run(s) without it failed ({failed[0].outcome.value}: {failed[0].reason[:120]})"
                if failed else f"within the noise floor {floor:.3f}: does not pay" if job[0] >= 1.0 - floor
                else f"costs more than it saves: without it {1 / job[0]:.3f}x faster")
        out.append(Contribution(**common, contribution=job[0], ci_low=job[1], ci_high=job[2],
                                step_contribution=step[0], pairs=tuple(pairs), kept=pays, note=note))
    return out, by_key


def _verdict_of(config: Config, pairs: list, floor: float, steps: float | None, seed0: int) -> Verdict:
    good = _ok_pairs(pairs)
    seeds = tuple(seed0 + i for i, (a, b) in enumerate(pairs) if a.outcome is Outcome.OK and b.outcome is Outcome.OK)
    return paired_verdict(config, "minimize", good, floor, job_steps=steps, seeds=seeds, problems=_problems(pairs))


def _choose(rt: CampaignRuntime, doctor: DoctorReport, replay: _Replay, winner: Verdict,
            contributions: list[Contribution], by_key: dict[str, list], steps: float | None,
            floor: float) -> tuple[Verdict | None, tuple[str, ...], str]:
    """The smallest measured config within noise of the winner that clears promotion."""
    seed0 = rt.spec.contract.seed + SEED_OFFSET
    drop = sorted((c for c in contributions if not c.kept), key=lambda c: c.contribution)
    if not drop:
        return None, (), "every change pays: the winner is promoted as verified"
    single = _verdict_of({**winner.config, drop[0].knob: drop[0].baseline_value}, by_key[drop[0].knob],
                         floor, steps, seed0)
    if len(drop) >= 2:
        joint = {**winner.config, **{c.knob: c.baseline_value for c in drop}}
        if not rt.space.violated(joint):
            n = rt.spec.budget.minimize_pairs
            w_runs, m_runs = _rounds(rt, doctor, replay, [dict(winner.config), joint], first_round=n)
            verdict = _verdict_of(joint, m_runs, floor, steps, seed0 + n)
            _, job, _ = _ratio(w_runs, m_runs, steps)
            if verdict.promoted and job is not None and job[0] <= 1.0 + floor:
                return verdict, tuple(c.knob for c in drop), "dropped every change that did not pay"
    if single.promoted:
        how = "the change that paid least (dropping all together was not confirmed)" if len(drop) >= 2 else \
            "the change that did not pay"
        return single, (drop[0].knob,), f"dropped {how}"
    return None, (), "the smaller config did not clear promotion on its own pairs: the winner stands"


def _settled(c: Contribution, dropped: tuple[str, ...]) -> Contribution:
    if c.kept or c.knob in dropped:
        return c if c.kept else replace(c, note=c.note + "; dropped")
    return replace(c, kept=True, note=c.note + "; kept: dropping it with the others was not confirmed")


def _final(verification: VerificationReport, winner: Verdict, minimal: Verdict | None,
           dropped: tuple[str, ...]) -> VerificationReport:
    if minimal is None:
        return verification
    superseded = [Verdict(**{**asdict(v), "promoted": False,
                             "reason": v.reason + f"; superseded: {', '.join(dropped)} did not pay"})
                  if v is winner else v for v in verification.verdicts]
    return VerificationReport(**{**{k: getattr(verification, k) for k in
                                    ("noise_floor", "doctor_noise_cv", "observed_noise_cv", "canary_effective",
                                     "canary_note")}, "verdicts": (*superseded, minimal)})


def run_minimize(rt: CampaignRuntime, doctor: DoctorReport, verification: VerificationReport) -> VerificationReport:
    """The verification report with the minimal config promoted in place of the winner."""
    path = rt.cdir.minimize
    if path.exists():
        return MinimizeReport.from_json(rt.cdir.read_json(path)).final
    winner, floor = verification.promoted, verification.noise_floor
    steps = job_steps(rt.spec.objective, doctor.step_time_s, doctor.startup_s)
    replay = _Replay(rt)
    base = full_baseline(rt, doctor)
    # In the space's knob order, never the verdict's key order: a resumed campaign reads the
    # verdict back from JSON (keys sorted) and must ask for the recorded runs in their order.
    config = dict(winner.config) if winner else {}
    changes = {k: config[k] for k in rt.space.names if k in config and base[k] != config[k]}
    contributions: list[Contribution] = []
    minimal, dropped = None, ()
    if winner is None:
        note = "nothing was promoted: nothing to minimize"
    elif rt.spec.budget.minimize_pairs == 0:
        note = "budget.minimize_pairs = 0: the winner is promoted as verified"
    elif len(changes) == 1:
        note = "one change: its contribution is the verified speedup"
        (k, v), = changes.items()
        contributions = [Contribution(knob=k, baseline_value=base[k], value=v, contribution=winner.speedup,
                                      ci_low=winner.ci_low, ci_high=winner.ci_high,
                                      step_contribution=winner.step_speedup, pairs=winner.pairs,
                                      note="its verification against the baseline")]
    else:
        contributions, by_key = _leave_one_out(rt, doctor, replay, winner, changes, steps, floor)
        minimal, dropped, note = _choose(rt, doctor, replay, winner, contributions, by_key, steps, floor)
        own = [w for _, w in by_key["winner"] if w.outcome is not Outcome.OK]
        if own:
            note += (f"; the winner itself failed {len(own)} of its {len(by_key['winner'])} runs here "
                     f"({own[0].trial_id} {own[0].outcome.value}: {own[0].reason[:160]}), rounds not counted")
        contributions = [_settled(c, dropped) for c in contributions]
    final = _final(verification, winner, minimal, dropped)
    report = MinimizeReport(winner=dict(winner.config) if winner else {}, contributions=tuple(contributions),
                            promoted=dict(final.promoted.config) if final.promoted else None, dropped=dropped,
                            noise_floor=floor, job_steps=steps, num_trials=replay.num_run, note=note, final=final)
    rt.cdir.write_json(path, report.to_json())
    return final
