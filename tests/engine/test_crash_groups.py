"""The crash model's value groups, and what counts as having run."""

from __future__ import annotations

import numpy as np

from infrarsi.core.knobs import Knob, KnobSpace
from infrarsi.core.trial import Outcome, Role, TrialResult
from infrarsi.engine.crash_model import CrashModel, knob_predicates
from infrarsi.engine.encoding import Encoding
from infrarsi.proposers import SearchContext, make_proposer

SPACE = KnobSpace(knobs=(Knob(name="ep", values=(1, 2, 4, 8)), Knob(name="compile", values=(False, True)),
                         Knob(name="recompute", values=("none", "selective", "full"))))
BASELINE = {"ep": 1, "compile": False, "recompute": "full"}
ENC = Encoding(SPACE, BASELINE)


def _fit(runs: list[tuple[dict, bool]]) -> CrashModel:
    configs = [{**BASELINE, **changes} for changes, _ in runs]
    return CrashModel(SPACE, BASELINE).fit(ENC.configs(configs), np.array([c for _, c in runs]),
                                           [f"t{i}" for i in range(len(runs))])


def _p_ok(model: CrashModel, **changes) -> float:
    return float(model.no_crash_probability(ENC.configs([{**BASELINE, **changes}]))[0])


def test_groups_are_the_values_above_below_or_other_than_the_baseline():
    labels = {(SPACE.knobs[p.knob].name, p.label) for p in knob_predicates(SPACE, BASELINE)}
    assert ("ep", "> 1") in labels and ("recompute", "!= full") in labels
    assert not any(label == "< 1" for _, label in labels)  # nothing below the smallest
    assert ("compile", True) in labels and not any(k == "compile" and str(v).startswith(("!", ">")) for k, v in labels)


def test_crashes_at_two_levels_make_the_third_suspect_with_its_partner_only():
    """compile with ep 2 and with ep 8 crashed, compile and ep 2 each ran: the rule is
    "compile with expert parallelism", so compile with ep 4, never tried, is suspect,
    while ep 4 without compile is not."""
    runs = [({}, False), ({"compile": True}, False), ({"ep": 2}, False), ({"ep": 8, "recompute": "none"}, False),
            ({"ep": 2, "compile": True}, True), ({"ep": 8, "compile": True}, True)]
    model = _fit(runs)
    assert _p_ok(model, ep=4, compile=True) < 0.5 < 0.8 < _p_ok(model, ep=4)
    top = model.flagged()[0]
    assert top["settings"] == [["ep", "> 1"], ["compile", True]] and top["crashed_trials"] == ["t4", "t5"]


def test_an_oom_clears_the_settings_it_held_of_crashing():
    """A config that ran out of memory got through start-up: the engine counts it as having
    run, so a later crash of compile with sdpa is blamed on the pair, and compile with a
    larger micro-batch stays likely to start. Left out, the OOM clears nothing and compile
    itself shares the blame."""
    space = KnobSpace(knobs=(Knob(name="micro_batch", values=(1, 8)), Knob(name="compile", values=("off", "on")),
                             Knob(name="attention", values=("naive", "sdpa"))))
    base = {"micro_batch": 1, "compile": "off", "attention": "naive"}
    ctx = SearchContext(space=space, baseline=base, memory_capacity_bytes=10 * 2**30, seed=0)
    engine = make_proposer("engine", ctx)

    def run(i, outcome, **changes):
        ok = outcome is Outcome.OK
        return TrialResult(trial_id=f"t{i}", config={**base, **changes}, role=Role.SEARCH, outcome=outcome,
                           step_time_s=1.0 if ok else None, peak_memory_bytes=2**30 if ok else 10 * 2**30,
                           memory_capacity_bytes=10 * 2**30)

    history = [run(0, Outcome.OK), run(1, Outcome.OOM, compile="on"), run(2, Outcome.OK, attention="sdpa"),
               run(3, Outcome.CRASH, compile="on", attention="sdpa")]
    for r in history:
        engine.observe(r)
    engine.describe()  # refits
    suspects = [u["settings"] for u in engine.crash_model.flagged(threshold=0.3)]
    assert suspects == [[["compile", "on"], ["attention", "sdpa"]]]
    enc = Encoding(space, base)
    bigger = enc.configs([{**base, "compile": "on", "micro_batch": 8}])
    without_oom = CrashModel(space, base).fit(enc.configs([r.config for r in history if r.outcome is not Outcome.OOM]),
                                               np.array([False, False, True]), ["t0", "t2", "t3"])
    assert engine.crash_model.no_crash_probability(bigger)[0] > 0.8 > 0.6 > without_oom.no_crash_probability(bigger)[0]
