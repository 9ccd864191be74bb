"""The engine end to end on the synthetic memory-wall problem, and the built-in priors."""

from __future__ import annotations

import json
import math

import numpy as np
from synthetic_problem import BASELINE, CAPACITY_BYTES, SPACE, SyntheticProblem

from infrarsi.core.knobs import Knob, KnobSpace
from infrarsi.core.priors import UNINFORMED_LOG_STD
from infrarsi.core.trial import Role
from infrarsi.engine.builtin_priors import builtin_priors, level
from infrarsi.engine.encoding import Encoding
from infrarsi.engine.memory_components import memory_components, part_levels
from infrarsi.engine.memory_model import MemoryModel
from infrarsi.proposers import SearchContext, make_proposer
from infrarsi.proposers.engine_proposer import COST_EXPONENT


def run_campaign(name: str, seed: int, budget: int = 120, experience=()):
    prob = SyntheticProblem(seed=seed)
    ctx = SearchContext(space=SPACE, baseline=BASELINE, memory_capacity_bytes=CAPACITY_BYTES, seed=seed,
                        experience_configs=tuple(experience))
    proposer = make_proposer(name, ctx)
    proposer.observe(prob.run(BASELINE, Role.DOCTOR))
    optimum = SPACE.key(prob.optimum())
    for num_trials in range(1, budget + 1):
        (config,) = proposer.suggest(1) or [None]
        if config is None:
            break
        proposer.observe(prob.run(config))
        if SPACE.key(config) == optimum:
            return num_trials, proposer
    return budget + 1, proposer


def test_engine_reaches_the_optimum_in_fewer_trials_than_random():
    seeds = range(5)
    engine = [run_campaign("engine", s)[0] for s in seeds]
    random = [run_campaign("random", s)[0] for s in seeds]
    assert np.median(engine) < np.median(random)
    assert np.median(engine) <= 20


def test_engine_report_is_json_and_explains_itself():
    _, proposer = run_campaign("engine", 0)
    report = json.loads(json.dumps(proposer.describe()))
    prices = {(p["knob"], p["value"]): p for p in report["memory_prices"]}
    assert prices[("micro_batch", 8)]["bytes_vs_baseline"] > 0 > prices[("checkpointing", "full")]["bytes_vs_baseline"]
    # The planted pair is among the most suspect units; a unit that every crashed config
    # also holds and no ok run has cleared ties with it (the data cannot tell them apart).
    # The engine now steers clear of likely crashes, so the campaign sees only two, and
    # two crashes shared by tied units stay below the report's flag bar (0.5): read the
    # crash model's suspects at a lower bar.
    evidence = proposer.crash_model.flagged(threshold=0.25)
    top = evidence[0]["crash_probability"]
    suspects = [u["settings"] for u in evidence if u["crash_probability"] == top]
    assert [["compile", "on"], ["optimizer", "fused"]] in suspects
    assert all(len(s) == 2 for s in suspects)  # a pair, never a single setting
    assert report["best_so_far"]["config"]["micro_batch"] == 8


def test_a_fast_config_that_does_not_fit_is_paired_with_the_cheapest_saver():
    """Micro-batch 8 with sdpa ran out of memory; the predicted-fastest config holds
    micro-batch 8, so the engine keeps it and switches in the saver that costs the least
    time per byte (full recompute: 10 GiB base, micro-batch 8 is +1.2 log memory)."""
    prob = SyntheticProblem(seed=0)
    ctx = SearchContext(space=SPACE, baseline=BASELINE, memory_capacity_bytes=CAPACITY_BYTES, seed=0)
    proposer = make_proposer("engine", ctx)
    proposer.observe(prob.run(BASELINE, Role.DOCTOR))
    for changes in ({"micro_batch": 2}, {"micro_batch": 4}, {"attention": "sdpa"},
                    {"micro_batch": 8, "attention": "sdpa"}):
        proposer.observe(prob.run({**BASELINE, **changes}))
    assert proposer.history[-1].outcome.value == "oom"
    proposer.num_started = proposer.num_start  # past the start: the models choose
    (config,) = proposer.suggest(1)
    (decision,) = proposer.describe()["pairing_decisions"]
    assert decision["hungry_setting"] == {"knob": "micro_batch", "value": 8}
    assert decision["fast_fit_probability"] < 0.6 <= decision["steps"][-1]["fit_probability"]
    assert config == decision["paired_config"]
    assert config["micro_batch"] == 8 and config["checkpointing"] != "none"
    assert prob.fits(config)


def _costed_search(cost_exponent: float, seed: int, budget: int = 12) -> tuple[float, float, object]:
    """A search on the synthetic problem where compiling costs a run 40 s of start-up
    against 5 s: (wall seconds spent, speedup found as a fraction of the optimum's, proposer)."""
    prob = SyntheticProblem(seed=seed, startup_s=(40.0, 5.0))
    ctx = SearchContext(space=SPACE, baseline=BASELINE, memory_capacity_bytes=CAPACITY_BYTES, seed=seed,
                        extra={"cost_exponent": cost_exponent})
    proposer = make_proposer("engine", ctx)
    proposer.observe(prob.run(BASELINE, Role.DOCTOR))
    wall, best = 0.0, prob.log_time(BASELINE)
    for _ in range(budget):
        (config,) = proposer.suggest(1)
        result = prob.run(config)
        proposer.observe(result)
        wall += result.wall_time_s
        if result.outcome.value == "ok":
            best = min(best, prob.log_time(config))
    return wall, math.exp(prob.log_time(BASELINE) - best) / math.exp(
        prob.log_time(BASELINE) - prob.log_time(prob.optimum())), proposer


def test_the_engine_learns_what_a_setting_costs_a_trial_and_spends_less_wall_time():
    """Compiling makes a trial slow to start but its steps faster (and the optimum holds
    it). The default engine divides each config's score by its predicted trial cost: over
    eight seeds it spends less wall time than the same engine ignoring cost and still
    ends at the optimum, and its cost model has learned that compiling is what costs."""
    aware = [_costed_search(COST_EXPONENT, seed) for seed in range(8)]
    blind = [_costed_search(0.0, seed) for seed in range(8)]
    assert COST_EXPONENT > 0
    assert np.median([w for w, _, _ in aware]) < 0.95 * np.median([w for w, _, _ in blind])
    assert np.median([f for _, f, _ in aware]) >= np.median([f for _, f, _ in blind]) - 1e-9
    assert np.median([f for _, f, _ in aware]) > 0.97
    effects = {(e["knob"], e["value"]): e["log_cost_effect"]
               for e in aware[0][2].describe()["trial_cost_effects"]}
    assert effects[("compile", "on")] > math.log(2.0)
    assert max(abs(v) for k, v in effects.items() if k[0] != "compile") < effects[("compile", "on")] / 2


def test_first_batch_is_diverse_and_uses_experience():
    experience = {"micro_batch": 4, "checkpointing": "full", "compile": "on", "attention": "sdpa", "optimizer": "foreach"}
    ctx = SearchContext(space=SPACE, baseline=BASELINE, memory_capacity_bytes=CAPACITY_BYTES,
                        experience_configs=(experience,))
    first = make_proposer("engine", ctx).suggest(3)
    assert first[0] == experience
    distances = [sum(c[k] != BASELINE[k] for k in BASELINE) for c in first]
    assert min(distances) >= 2  # not one-knob moves around a single incumbent
    assert len({SPACE.key(c) for c in first}) == 3


def test_experience_read_before_a_patch_knob_existed_starts_with_the_patch_off():
    # The bank is read before the patch round adds its knobs: its configs do not name them.
    space = KnobSpace(knobs=(*SPACE.knobs, Knob(name="patch_fused_loss", values=(False, True))))
    baseline = {**BASELINE, "patch_fused_loss": False}
    experience = {"micro_batch": 4, "checkpointing": "full", "compile": "on", "attention": "sdpa", "optimizer": "foreach"}
    ctx = SearchContext(space=space, baseline=baseline, memory_capacity_bytes=CAPACITY_BYTES,
                        experience_configs=(experience, {**experience, "no_such_knob": 1}))
    assert make_proposer("engine", ctx).suggest(1) == [{**experience, "patch_fused_loss": False}]


def test_builtin_priors_are_relative_to_the_baseline():
    space = KnobSpace(knobs=(Knob(name="checkpointing", values=("none", "selective", "full")),
                             Knob(name="mystery", values=(1, 2))))
    baseline = {"checkpointing": "full", "mystery": 1}
    priors = builtin_priors(space, baseline)
    none, full = priors.get("checkpointing", "none"), level("checkpointing", "full")
    # Relative to a "full" baseline, "none" undoes full recompute's time cost.
    assert math.isclose(none.log_time_mean, -full.log_time) and none.log_time_mean < 0
    assert priors.get("mystery", 2).source == "uninformed"
    assert level("compile", True).log_time < 0
    assert all(p.rationale for p in priors.settings.values())
    # Its memory is the part table's: "none" brings back the activations full recompute
    # dropped and leaves the rest; the whole-peak prior says nothing about it.
    enc = Encoding(space, baseline)
    comp = memory_components(enc, priors)
    j = enc.column_of("checkpointing", "none")
    acts = comp.parts.index("activations")
    assert math.isclose(comp.effect_mean[acts, j], -part_levels("checkpointing", "full")["activations"][0])
    assert all(comp.effect_mean[c, j] == 0.0 for c in range(len(comp.parts)) if c != acts)
    assert not comp.whole[j] and comp.whole[enc.column_of("mystery", 2)]
    assert none.log_memory_std == UNINFORMED_LOG_STD


def test_cpu_priors_expect_a_small_activation_share_and_no_sdpa_gain():
    """A CPU trainer's peak is mostly the runtime, and fused attention has no HBM traffic to
    save there: the CPU table must not rule out large micro-batches or favour sdpa, while
    the accelerator table keeps both."""
    from tiny_gpt import WIDE_BASELINE as baseline
    from tiny_gpt import WIDE_KNOBS, knob_space

    space = knob_space(WIDE_KNOBS)
    enc = Encoding(space, baseline)
    gpu, cpu = builtin_priors(space, baseline), builtin_priors(space, baseline, on_cpu=True)
    # Micro-batch 16 without recompute, against the micro-batch-2 full-recompute baseline,
    # under each memory model's prior.
    bigger = enc.main(enc.configs([{**baseline, "micro_batch": 16, "checkpointing": "none"}, baseline]))
    grow = {}
    for name, priors, on_cpu in (("gpu", gpu, False), ("cpu", cpu, True)):
        model = MemoryModel(enc, priors, 2**30, memory_components(enc, priors, on_cpu=on_cpu))
        mean, _ = model.predict_main(bigger)
        grow[name] = mean[0] - mean[1]
    # The built-in tiny flavour measured +11% here (324 -> 360 MB in bf16): CPU within 2x, GPU far off.
    assert grow["cpu"] < math.log(2.0) < math.log(3.0) < grow["gpu"]
    assert cpu.get("attention", "sdpa").log_time_mean == 0.0 > gpu.get("attention", "sdpa").log_time_mean
    # Time priors of the other knobs are the same tables.
    assert cpu.get("precision", "bf16").log_time_mean == gpu.get("precision", "bf16").log_time_mean
    assert cpu.source == "builtin-cpu"


def test_moe_priors_expect_expert_parallelism_to_pay_and_zero3_to_cost():
    """A space with an expert-parallel knob is an MoE job: EP and larger micro-batches
    speed it up, ZeRO-3 and TP cost more than in a dense job. On an extra development MoE
    job (not one the numbers were set on) each EP and micro-batch prior has the sign of
    the simulator's least-squares effect over every config that runs."""
    from infrarsi.sim import sim_workload
    from infrarsi.sim.generator import split_names
    from infrarsi.sim.oracle import evaluate_space

    dense = KnobSpace(knobs=(Knob(name="tp", values=(1, 2, 4)), Knob(name="zero", values=(1, 3))))
    moe = KnobSpace(knobs=dense.knobs + (Knob(name="ep", values=(1, 2, 4)),))
    d, m = builtin_priors(dense, {"tp": 1, "zero": 1}), builtin_priors(moe, {"tp": 1, "zero": 1, "ep": 1})
    assert m.get("ep", 4).log_time_mean < m.get("ep", 2).log_time_mean < 0
    assert m.get("zero", 3).log_time_mean > d.get("zero", 3).log_time_mean > 0
    assert m.get("tp", 4).log_time_mean > d.get("tp", 4).log_time_mean > 0

    name = next(n for n in split_names("development-extra") if "ep" in sim_workload(n).space.names)
    w = sim_workload(name)
    idx, est = evaluate_space(w)
    enc = Encoding(w.space, dict(w.baseline))
    x = enc.main(idx[est.ok])
    coef, *_ = np.linalg.lstsq(np.hstack([np.ones((len(x), 1)), x]), np.log(est.step_time_s[est.ok]), rcond=None)
    priors = builtin_priors(w.space, dict(w.baseline))
    checked = 0
    for j in range(enc.num_settings):
        knob, value = enc.label(j)
        if knob in ("ep", "micro_batch") and abs(coef[1 + j]) > 0.1:
            assert np.sign(priors.get(knob, value).log_time_mean) == np.sign(coef[1 + j]), (knob, value)
            checked += 1
    assert checked >= 2
