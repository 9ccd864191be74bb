"""How a config reaches the job: the argv and environment of one trial.

The command template's ``{placeholders}`` take the contract's values and placeholder
knobs; each flag knob is appended in its style (``--k v``, ``--k=v`` / ``k=v``, or a bare
``--k`` switch); each env knob sets its variable. Values are argv entries or environment
values, never spliced into a shell string.
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


def render_command(spec: "CampaignSpec", space: KnobSpace, config: Config, *, seed: int | None = None
                   ) -> tuple[tuple[str, ...], dict[str, str]]:
    """argv and extra environment that carry ``config`` to the job. ``seed`` replaces the
    contract's seed (verification's canary runs)."""
    values = {"python": sys.executable, "seq_len": spec.contract.seq_len,
              "global_batch_tokens": spec.contract.global_batch_tokens,
              "num_steps": spec.contract.num_steps, "seed": spec.contract.seed if seed is None else seed}
    values.update({k.name: config[k.name] for k in space.knobs if k.placeholder})
    argv = [token.format(**values) for token in spec.command]
    env = dict(spec.env)
    for knob in space.knobs:
        if knob.flag is not None:
            argv += flag_args(knob, config[knob.name])
        elif knob.env is not None:
            env[knob.env] = str(config[knob.name])
    return tuple(argv), env
