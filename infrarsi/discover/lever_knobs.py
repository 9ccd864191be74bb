"""The knobs the lever catalog adds to a draft: the levers of the job's families that apply
on this machine, each with the value the job runs today as its baseline.

The value the command typed is the baseline (a flag, an ``env`` prefix, a launcher option),
never a reason to drop the lever; where the command does not set it, the baseline is what
``--help``, the job's own settings, the inherited environment, the launcher or the
catalog's documented default say the job runs. A lever with no known baseline is left
out: the search must start from the job as it is.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

from infrarsi.core.knobs import Constraint
from infrarsi.discover.command import Flag, ParsedCommand, literal
from infrarsi.discover.levers import Family, JobFacts, Lever, candidate_values, families_of, normal


@dataclass(frozen=True, kw_only=True)
class Machine:
    """Where the trials run: a trial's cores, the GPUs it may use, torch's thread count."""

    cpus: int
    gpus: int = 0
    torch_threads: int | None = None

    @property
    def device(self) -> str:
        return "cuda" if self.gpus else "cpu"

    @property
    def max_devices(self) -> int:
        return self.gpus or self.cpus


@dataclass(frozen=True, kw_only=True)
class Levers:
    """The families a job belongs to and what they say, for one draft."""

    families: tuple[Family, ...]
    machine: Machine
    max_processes: int  # processes a trial of this job may run: above 1 only where a lever sets them

    def all(self) -> list[Lever]:
        return [lever for f in self.families for lever in f.levers]

    def of_flag(self, flag: Flag) -> Lever | None:
        """The catalog lever this entry flag is, if any."""
        return next((lv for lv in self.all() if lv.flag and lv.key == normal(flag.name)), None)

    def applies(self, lever: Lever) -> bool:
        return lever.offered and lever.applies(self.machine.device, self.max_processes)


def levers_for(cmd: ParsedCommand, facts: JobFacts, machine: Machine,
               families: tuple[Family, ...] | None = None) -> Levers:
    """The job's families and what they offer on ``machine``: processes above one only
    where the command gives a process count (a launcher's, or a flag lever's)."""
    found = families if families is not None else families_of(facts)
    one = Levers(families=found, machine=machine, max_processes=1)
    spawns = cmd.nproc is not None or any(
        (lv := one.of_flag(f)) is not None and lv.kind == "processes" for f in cmd.flags)
    return Levers(families=found, machine=machine, max_processes=machine.max_devices if spawns else 1)


def defaulted_flags(levers: Levers, known: set[str], style: str) -> list[Flag]:
    """Flags of the families' levers that neither the command nor the job's parser listed,
    at the catalog's documented default: a flag the family is known to take."""
    out = []
    for lever in levers.all():
        if (lever.flag and lever.default is not None and lever.key not in known and not lever.only_typed
                and levers.applies(lever)):
            flag_style = lever.style or ("equals" if not lever.flag.startswith("-") else style)
            out.append(Flag(lever.key, lever.flag, lever.default, flag_style,
                            origin=f"the {lever.name} lever's documented default (catalog)"))
    return out


def lever_knob(flag: Flag, lever: Lever, levers: Levers) -> dict[str, Any] | None:
    """The knob table (with its ``baseline``) for an entry flag that is a catalog lever, or
    None where it cannot be one here: no known value, or fewer than two candidates."""
    value = flag.value if flag.value is not None else lever.default
    if value is None or value == "torch" or not levers.applies(lever) or (
            lever.only_typed and flag.origin != "the command"):
        return None
    flag = dataclasses.replace(flag, value=value)
    values = candidate_values(lever, cpus=levers.machine.cpus, devices=levers.max_processes)
    if flag.choices:
        values = [v for v in values if v in flag.choices]
    if lever.kind == "optimizer" and flag.value not in values:
        return None  # from another algorithm, no implementation of this one is the same training
    values = _with_baseline(flag.value, values)
    if values is None:
        return None
    knob = _knob(lever, values, flag.value)
    knob["flag"] = flag.spelled
    if flag.style == "switch" or lever.style == "switch":
        knob["flag_style"] = "switch"
    elif flag.style:
        knob["flag_style"] = flag.style
    return knob


def _with_baseline(baseline: Any, candidates: list) -> list | None:
    """The candidates with the baseline among them (numbers in order), or None where that
    leaves fewer than two: no choice to search."""
    values = list(dict.fromkeys([baseline, *candidates]))
    if len(values) < 2:
        return None
    return sorted(values) if all(isinstance(v, int) and not isinstance(v, bool) for v in values) else values


def _knob(lever: Lever, values: list, baseline: Any) -> dict[str, Any]:
    knob: dict[str, Any] = {"values": values, "kind": lever.kind, "baseline": baseline,
                            "description": lever.why + (f"; {lever.coupling}" if lever.coupling else "")}
    if lever.levels:
        spelled = {str(v).lower() if isinstance(v, bool) else str(v) for v in values}
        knob["levels"] = {k: v for k, v in lever.levels.items() if k in spelled}
    if lever.numerics == "declared":
        knob["numerics"] = "changes"
    return knob


def env_knobs(cmd: ParsedCommand, levers: Levers, environ: Mapping[str, str], taken_kinds: set[str]
              ) -> dict[str, dict[str, Any]]:
    """Knobs (each with its ``baseline``) for the families' environment levers: the typed
    prefix's value, else the inherited environment's, else what the job runs unset."""
    out: dict[str, dict[str, Any]] = {}
    for lever in levers.all():
        if lever.env is None or not levers.applies(lever) or (lever.kind in taken_kinds and lever.kind != "other"):
            continue
        raw = cmd.env.get(lever.env)
        if raw is None and lever.only_typed:
            continue
        raw = raw if raw is not None else environ.get(lever.env)
        if raw is None:
            raw = _launcher_sets(cmd, levers, lever.env)
        base = literal(raw) if raw is not None else (
            levers.machine.torch_threads if lever.default == "torch" else lever.default)
        if base is None:
            continue
        values = _with_baseline(base, candidate_values(lever, cpus=levers.machine.cpus,
                                                        devices=levers.max_processes))
        if values is None:
            continue
        out[lever.name] = {**_knob(lever, values, base), "env": lever.env}
    return out


def _launcher_sets(cmd: ParsedCommand, levers: Levers, variable: str) -> str | None:
    """What the launcher sets ``variable`` to where the environment leaves it unset."""
    for family in levers.families:
        if cmd.launcher in family.detect.launchers and (cmd.nproc or 1) > 1 and variable in family.sets_env:
            return str(family.sets_env[variable])
    return None


def launcher_knobs(cmd: ParsedCommand, levers: Levers, template: list[str], taken_kinds: set[str]
                   ) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """Placeholder knobs for the launcher's levers: in place where the command types the
    option; else, at the family's default, tokens to insert before the entry."""
    knobs: dict[str, dict[str, Any]] = {}
    inserted: list[str] = []
    for lever in levers.all():
        if not lever.launcher or not levers.applies(lever) or (lever.kind in taken_kinds and lever.kind != "other"):
            continue
        names = {normal(s) for s in lever.launcher}
        typed = next((f for f in cmd.launcher_flags if f.name in names), None)
        if typed is None and (lever.only_typed or lever.default is None):
            continue
        base = typed.value if typed is not None else lever.default
        values = _with_baseline(base, candidate_values(lever, cpus=levers.machine.cpus,
                                                        devices=levers.max_processes))
        if values is None:
            continue
        if typed is not None:
            template[typed.index] = (f"{typed.spelled}={{{lever.name}}}" if typed.style == "equals"
                                     else "{" + lever.name + "}")
        else:
            inserted += [lever.launcher[0], "{" + lever.name + "}"]
        knobs[lever.name] = {**_knob(lever, values, base), "placeholder": True}
        taken_kinds.add(lever.kind)
    return knobs, inserted


def coupling_constraints(knobs: Mapping[str, Mapping[str, Any]], baseline: Mapping[str, Any], levers: Levers
                         ) -> tuple[list[str], list[str]]:
    """(constraints, notes): each coupling of the families between two kinds that both have
    a knob, where the baseline keeps it (a note says so where it does not)."""
    by_kind = {k.get("kind"): name for name, k in knobs.items()}
    constraints, notes = [], []
    for family in levers.families:
        for c in family.couplings:
            if levers.machine.device not in c.devices or not all(k in by_kind for k in c.kinds):
                continue
            expr = c.constraint.format(**{k: by_kind[k] for k in c.kinds}, cpus=levers.machine.cpus)
            if Constraint(expr).holds(baseline):
                constraints.append(expr)
            else:
                notes.append(f"not a constraint: {expr} ({c.why}), since the command itself breaks it")
    return constraints, notes


def unoffered_notes(cmd: ParsedCommand, levers: Levers) -> list[str]:
    """Header notes: the command's flags that are levers never offered (they change what is
    trained, or are unsafe), and the families' levers that do not apply on this machine."""
    notes = []
    typed = {f.name for f in cmd.flags}
    for lever in levers.all():
        if lever.flag and lever.key in typed and not lever.offered:
            notes.append(f"{lever.flag} is not a knob: {lever.why}")
        if lever.env and lever.env in cmd.env and not lever.offered:
            notes.append(f"{lever.env} is not a knob: {lever.why}")
    elsewhere = sorted({lv.name for lv in levers.all() if lv.offered
                        and levers.machine.device not in lv.devices})
    if elsewhere:
        names = ", ".join(f.family for f in levers.families)
        notes.append(f"levers of {names} not offered on this machine ({levers.machine.device}): "
                     f"{', '.join(elsewhere)}")
    return notes
