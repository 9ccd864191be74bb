"""How a config reaches the job: the argv and environment of one trial.

The spec's command is the baseline as the user launches it. Rendering keeps it token for
token and in order: each ``{placeholder}`` takes a contract value (``{num_steps}``,
``{last_step}`` for a loop that runs 0..N inclusive, ``{num_tokens}`` for a job whose
length is counted in tokens, ``{seq_len}``, ``{seed}``, ...) or a
placeholder knob's value where the typed value stood; a placeholder switch knob written as
the lone token ``{name}`` is its flag when on and nothing when off. A knob that is not in
the command reaches the job at every config's value, the baseline's included: a flag
appended in its style (``--k v``, ``--k=v`` / ``k=v``, or a bare ``--k`` switch, nothing
when off) or an environment variable. So the baseline runs what the spec says it runs,
never the job's own default in its place, and a trial differs from it only by the knobs it
changes. Values are argv entries or environment values, never spliced into a shell string.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from infrarsi.core.knobs import Config, Knob, KnobSpace, Value

if TYPE_CHECKING:
    from infrarsi.core.spec import CampaignSpec


def flag_args(knob: Knob, value: Value) -> list[str]:
    """The argv entries that give ``knob`` the value ``value``."""
    assert knob.flag is not None
    if knob.flag_style == "equals":
        return [f"{knob.flag}={value}"]
    if knob.flag_style == "switch":
        return [knob.flag] if value else []
    return [knob.flag, str(value)]


def contract_values(spec: "CampaignSpec", *, seed: int | None = None) -> dict[str, object]:
    """The contract's placeholders and their values (``seed`` replaces the contract's)."""
    c = spec.contract
    return {"python": sys.executable, "seq_len": c.seq_len, "global_batch_tokens": c.global_batch_tokens,
            "num_steps": c.num_steps, "last_step": c.num_steps - 1, "num_tokens": c.num_steps * c.global_batch_tokens,
            "seed": c.seed if seed is None else seed}


def render_command(spec: "CampaignSpec", space: KnobSpace, config: Config, *, seed: int | None = None
                   ) -> tuple[tuple[str, ...], dict[str, str]]:
    """argv and extra environment that carry ``config`` to the job. ``seed`` replaces the
    contract's seed (verification's canary runs)."""
    values = {**contract_values(spec, seed=seed), **{k.name: config[k.name] for k in space.knobs if k.placeholder}}
    switches = {"{" + k.name + "}": k for k in space.knobs if k.placeholder and k.flag_style == "switch" and k.flag}
    argv: list[str] = []
    for token in spec.command:
        if token in switches:
            argv += flag_args(switches[token], config[switches[token].name])
        else:
            argv.append(token.format(**values))
    env = dict(spec.env)
    for knob in space.knobs:
        if knob.placeholder or (knob.flag is None and knob.env is None):
            continue  # in the command already, or read by the backend (a patch, a simulated knob)
        value = config[knob.name]
        if knob.flag is not None:
            argv += flag_args(knob, value)
        elif knob.env is not None:
            env[knob.env] = str(value)
    return tuple(argv), env
