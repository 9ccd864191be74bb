"""The memory model of the peak's parts against planted sums of parts."""

from __future__ import annotations

import math

import numpy as np

from infrarsi.core.knobs import Constraint, Knob, KnobSpace
from infrarsi.core.priors import Priors, SettingPrior
from infrarsi.engine.builtin_priors import builtin_priors
from infrarsi.engine.encoding import Encoding
from infrarsi.engine.memory_components import memory_components, zero_bytes_per_param
from infrarsi.engine.memory_model import EXACT, MemoryModel

GIB = 2**30
SPACE = KnobSpace(knobs=(Knob(name="micro_batch", values=(1, 2, 4, 8)),
                         Knob(name="checkpointing", values=("none", "selective", "full")),
                         Knob(name="compile", values=("off", "on"))))
BASELINE = {"micro_batch": 1, "checkpointing": "full", "compile": "off"}
KEPT = {"none": 1.0, "selective": 0.5, "full": 0.1}


def planted_peak(config: dict, fixed: float, states: float, activations: float) -> float:
    """A peak that is a sum: activations grow with the micro-batch and shrink with recompute
    (``activations`` is their size at micro-batch 1 without recompute)."""
    acts = activations * config["micro_batch"] * KEPT[config["checkpointing"]]
    return fixed + states + acts * (0.9 if config["compile"] == "on" else 1.0)


def _fit(model: MemoryModel, enc: Encoding, configs: list[dict], peaks: list[float]) -> MemoryModel:
    return model.fit(enc.configs(configs), np.full(len(configs), EXACT), np.log(peaks))


def _errors(parts: tuple[float, float, float]) -> tuple[float, float]:
    """RMS log error over every config after five measured ones, by parts and log-additive."""
    enc = Encoding(SPACE, BASELINE)
    priors = builtin_priors(SPACE, BASELINE)
    seen = [BASELINE, {**BASELINE, "micro_batch": 2}, {**BASELINE, "checkpointing": "none"},
            {**BASELINE, "compile": "on"}, {**BASELINE, "micro_batch": 4, "checkpointing": "selective"}]
    truth = np.log([planted_peak(c, *parts) for c in SPACE.feasible])
    errs = []
    for comps in (memory_components(enc, priors), None):
        # The log-additive model gets the parts model's own prior, summed into whole-peak factors.
        whole = priors if comps is not None else _whole_peak_priors(enc, priors)
        model = _fit(MemoryModel(enc, whole, 100 * GIB, comps), enc, seen, [planted_peak(c, *parts) for c in seen])
        pred, _ = model.predict_main(enc.feasible_main)
        errs.append(float(np.sqrt(np.mean((pred - truth) ** 2))))
    return errs[0], errs[1]


def _whole_peak_priors(enc: Encoding, priors: Priors) -> Priors:
    mean, std = MemoryModel(enc, priors, None, memory_components(enc, priors)).prior_main_effects()
    return Priors.of([SettingPrior(knob=k, value=v, log_memory_mean=float(mean[j]), log_memory_std=float(std[j]))
                      for j, (k, v) in enumerate(enc.label(i) for i in range(enc.num_settings))], "test")


def test_parts_predict_a_states_bound_and_an_activation_bound_job_alike():
    """Recompute and micro-batch matter in proportion to the activations: one job whose peak
    is its states (20 GiB states, 1 GiB of activations), one whose peak is activations (2
    GiB states, 12 GiB). Five runs each; the parts model predicts every config within a few
    percent on both, the log-additive one is off by much more on at least one."""
    errors = {parts: _errors(parts) for parts in ((2 * GIB, 20 * GIB, 1 * GIB), (2 * GIB, 2 * GIB, 12 * GIB))}
    for parts, (by_parts, _) in errors.items():
        assert by_parts < 0.05, parts
    worst_additive = max(additive for _, additive in errors.values())
    assert worst_additive > 3 * max(by_parts for by_parts, _ in errors.values())


def test_zero_sharding_acts_through_stage_and_data_parallel_degree_together():
    """ZeRO-3 over 8 ranks keeps 2 of 16 bytes per parameter, over 2 ranks 8: the prior
    alone says so through the sharding feature, which neither knob could on its own."""
    space = KnobSpace(knobs=(Knob(name="tp", values=(1, 4)), Knob(name="dp", values=(2, 8)),
                             Knob(name="zero", values=(0, 3))), constraints=(Constraint("tp * dp == 8"),))
    baseline = {"tp": 1, "dp": 8, "zero": 0}
    enc = Encoding(space, baseline)
    priors = builtin_priors(space, baseline)
    comp = memory_components(enc, priors)
    model = MemoryModel(enc, priors, 100 * GIB, comp)
    configs = [baseline, {"tp": 1, "dp": 8, "zero": 3}, {"tp": 4, "dp": 2, "zero": 3}, {"tp": 4, "dp": 2, "zero": 0}]
    mean, _ = model.predict_main(enc.main(enc.configs(configs)))
    share = math.exp(comp.log_share[comp.parts.index("states")])
    # ZeRO-3 over 8 ranks moves only the states part, which shrinks 8x.
    assert math.isclose(mean[1] - mean[0], math.log(1 - share + share * 2 / 16), rel_tol=1e-6)
    # Over 2 ranks with tp 4 the states shrink as much (4 x 2), and tp shards activations too.
    assert mean[2] < min(mean[1], mean[3]) and max(mean[1], mean[3]) < mean[0]
    assert math.isclose(zero_bytes_per_param(np.array(3), np.array(2)), 8.0)


def test_a_prior_from_elsewhere_scales_the_whole_peak():
    """An experience-bank (or LLM, or patch-metadata) prior on a setting the part table
    knows overrides the table: the setting then scales every part by that prior's factor."""
    enc = Encoding(SPACE, BASELINE)
    builtin = builtin_priors(SPACE, BASELINE)
    bank = Priors.of([SettingPrior(knob="compile", value="on", log_memory_mean=math.log(1.3), log_memory_std=0.05,
                                   source="bank")], "bank").merged_over(builtin)
    comp = memory_components(enc, bank)
    j = enc.column_of("compile", "on")
    assert comp.whole[j] and np.allclose(comp.effect_mean[:, j], math.log(1.3))
    assert not memory_components(enc, builtin).whole[j]
