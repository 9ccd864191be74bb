"""Prior revision: where do live runs contradict the priors?

For each setting, the prior mean of its log-time and log-memory effect is compared with the
posterior mean; a gap of more than ``num_sd`` prior standard deviations flags the prior as
miscalibrated (reported, and stored with the campaign in the experience bank when it ends).
The memory prior compared is the memory model's own: its effect on the baseline's peak
before any data (``MemoryModel.prior_main_effects``), which the part structure decides
for the settings it knows.
"""

from __future__ import annotations

from infrarsi.core.priors import Priors
from infrarsi.engine.encoding import Encoding
from infrarsi.engine.memory_model import MemoryModel
from infrarsi.engine.time_model import TimeModel


def revise_priors(encoding: Encoding, priors: Priors, time_model: TimeModel,
                  memory_model: MemoryModel, *, num_sd: float = 2.0) -> list[dict]:
    """One record per setting with prior vs posterior numbers and the flags."""
    t_mean, t_sd = time_model.main_effects()
    m_mean, m_sd = memory_model.main_effects()
    mp_mean, mp_sd = memory_model.prior_main_effects()
    out = []
    for j in range(encoding.num_settings):
        knob, value = encoding.label(j)
        prior = priors.get(knob, value)
        rec = {"knob": knob, "value": value, "source": prior.source}
        for what, mean, sd, p_mean, p_sd, seen in (
            ("time", t_mean[j], t_sd[j], prior.log_time_mean, prior.log_time_std, time_model.num_observations),
            ("memory", m_mean[j], m_sd[j], float(mp_mean[j]), float(mp_sd[j]), memory_model.num_observations),
        ):
            gap_sd = (float(mean) - p_mean) / p_sd
            rec[what] = {"prior_log_mean": p_mean, "prior_log_sd": p_sd,
                         "posterior_log_mean": float(mean), "posterior_log_sd": float(sd),
                         "gap_prior_sd": gap_sd, "miscalibrated": bool(seen and abs(gap_sd) > num_sd)}
        rec["miscalibrated"] = rec["time"]["miscalibrated"] or rec["memory"]["miscalibrated"]
        out.append(rec)
    return out


def miscalibrated(revisions: list[dict]) -> list[dict]:
    return [r for r in revisions if r["miscalibrated"]]
