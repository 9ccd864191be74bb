"""The spec ``infrarsi init`` writes, from the command as typed and what its dry runs showed.

The command stays the baseline, token for token: a value a knob or the contract takes is
replaced where it stood (``--batch_size=12`` -> ``--batch_size={batch_size}``) and nothing
is moved. Added to it: the step flag (and a seed flag the job's parser knows, so that canary
seeds reach the job) where the command lacks them, since a trial must choose how many steps
it runs; the levers of the job's families (``infrarsi.discover.levers``) that the command
does not set, each passed at its baseline on every run (a flag appended, a launcher option
before the entry, an environment variable), so the baseline runs what the spec says.
Guesses are checked before they are written: a tokens-per-step figure only where it equals
the command's own product (micro-batch x accumulation x sequence length x processes), a
step placeholder only where the dry run printed as many losses as its step value asked
for (``{last_step}`` where the loop runs 0..N inclusive), a loss signal only from an honest
split's dry run. What cannot be checked stays a placeholder marked ``CONFIRM``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Mapping

from infrarsi.discover.knobs import draft_knob, kind_of, one_knob_per_kind
from infrarsi.discover.lever_knobs import (Levers, coupling_constraints, defaulted_flags, env_knobs, launcher_knobs,
                                           lever_knob, unoffered_notes)
from infrarsi.discover.command import Flag, ParsedCommand
from infrarsi.discover.log_patterns import GuessedPatterns
from infrarsi.contract.numerics import CHANGES, default_numerics

CONTRACT_NAMES = {
    "num_steps": ("max_iters", "max_steps", "steps", "num_steps", "iters", "train_steps", "total_steps",
                  "max_iterations", "max_steps_per_epoch", "train_iters"),
    "num_tokens": ("max_tokens",),  # a job that counts its length in tokens (litgpt pretrain)
    "seq_len": ("block_size", "seq_len", "seq_length", "max_seq_length", "max_seq_len", "context_length",
                "sequence_length", "max_length"),
    "seed": ("seed",),
}
# Sequences per optimizer step, where a job takes them instead of an accumulation count: the
# accumulation follows from it and the micro-batch (litgpt's --train.global_batch_size).
GLOBAL_BATCH_NAMES = ("global_batch_size",)
DRY_RUN_STEPS = 3
MIN_TRIAL_STEPS, MAX_TRIAL_STEPS = 8, 20  # a trial needs a few measured steps past its warm-up


def contract_field_of(flag: Flag) -> str | None:
    """The contract field a flag gives, by its name; none for a nested flag of evaluation or
    generation (``--eval.max_iters`` is not the training's step count)."""
    if re.search(r"(^|\.)(eval|val|valid|validation|test|generate|generation)\.", flag.name):
        return None
    return next((k for k, names in CONTRACT_NAMES.items() if flag.key in names), None)


@dataclass(frozen=True, kw_only=True)
class SplitComparison:
    """The losses two dry runs printed, the command's and an honest split of its batch's,
    compared at every step both printed."""

    moved: float        # the largest relative difference between the two runs' losses at one step
    at_step: int        # where it is largest: the printed loss's index, 0 for the first
    num_compared: int   # the steps both runs printed
    resolution: float   # the relative size of the printed values' last digit (the largest of them)


@dataclass(frozen=True, kw_only=True)
class Observed:
    """What the dry runs showed (nothing, with ``--no-dry-run``)."""

    patterns: GuessedPatterns = GuessedPatterns()
    num_losses: int | None = None  # loss lines printed for DRY_RUN_STEPS steps
    first_loss: float | None = None
    fact_lines: tuple[str, ...] = ()  # start-up lines that state the model (parameter counts)
    files_read: tuple[str, ...] = ()  # under the workload folder
    split: SplitComparison | None = None  # the printed losses of an honest split against the command's


@dataclass
class Draft:
    """The spec being written, with comments for the keys the user must look at."""

    data: dict[str, Any]
    confirm: dict[str, str] = field(default_factory=dict)   # "table.key" or "key" -> why
    notes: list[str] = field(default_factory=list)           # header lines


def knob_name(flag: Flag) -> str:
    return re.sub(r"\W", "_", flag.name)


def _escape(token: str) -> str:
    return token.replace("{", "{{").replace("}", "}}")


def in_place(flag: Flag, name: str) -> str:
    """The token that gives ``flag`` the placeholder ``{name}`` where its value stood."""
    if flag.style == "switch":
        return "{" + name + "}"
    return f"{_escape(flag.spelled)}={{{name}}}" if flag.style == "equals" else "{" + name + "}"


def appended(flag: Flag, name: str) -> list[str]:
    """The tokens that add ``flag`` with the placeholder ``{name}`` to a command that lacks it."""
    return [f"{flag.spelled}={{{name}}}"] if flag.style == "equals" else [flag.spelled, "{" + name + "}"]


def _as_typed(knob: dict[str, Any], flag: Flag) -> dict[str, Any]:
    """A boolean knob whose typed value prints otherwise than it reads (``false`` reads as
    False, which prints ``False``) keeps its values as typed text, in the case typed, so the
    baseline renders the token as the user typed it."""
    if flag.raw is None or str(knob["baseline"]) == flag.raw or not isinstance(knob["baseline"], bool):
        return knob
    case = str.lower if flag.raw.islower() else str.upper if flag.raw.isupper() else str.capitalize
    spell = {True: case("true"), False: case("false")}
    typed = {**knob, "values": [spell[v] for v in knob["values"]], "baseline": spell[knob["baseline"]]}
    if knob.get("levels"):
        typed["levels"] = {spell[k == "true"]: v for k, v in knob["levels"].items()}
    return typed


@dataclass(frozen=True, kw_only=True)
class CommandFacts:
    """What the command (and the job's parser) say about the contract, for
    ``infrarsi.discover.contract_draft``."""

    found: dict[str, Any]  # contract field -> value, from the command or the job's parser
    from_help: frozenset[str]  # the fields whose value is the parser's default, not the command's
    origins: dict[str, str] = field(default_factory=dict)  # those fields -> where it was read (--help, ...)
    product: int | None  # micro-batch x accumulation, where both are knobs
    step_offset: int = 0  # 1 where the step flag is {last_step}: the job runs its value + 1 steps


def draft_command(cmd: ParsedCommand, known: list[Flag], seen: Observed, *, name: str, levers: Levers,
                  environ: Mapping[str, str]) -> tuple[Draft, CommandFacts]:
    """The command, knobs, baseline and fixed products for ``cmd``: ``known`` adds the flags the
    job's parser lists that the command does not give; ``levers`` are its families' levers on
    this machine; ``environ`` is the environment the job inherits."""
    cpus = levers.machine.cpus
    given = {f.name for f in cmd.flags}
    style = max(("separate", "equals"), key=lambda s: sum(f.style == s for f in cmd.flags))
    every = cmd.flags + [f for f in known if f.name not in given]
    every += defaulted_flags(levers, {f.name for f in every}, style)
    draft = Draft(data={})
    template = [_escape(t) for t in cmd.argv]
    tail: list[str] = []  # what the command lacks: the step flag, a seed flag the parser knows
    knobs: dict[str, dict] = {}
    baseline: dict[str, Any] = {}
    contract: dict[str, Any] = {}
    from_help: set[str] = set()  # contract fields whose value is the parser's default
    origins: dict[str, str] = {}
    step_offset = 0
    mb, ga, gb = batch_flags(every)
    split = ga is not None
    product = mb.value * ga.value if split else gb.value if gb is not None else None
    knob_product = product * (cmd.nproc or 1) if split else product

    def knob_of(flag: Flag) -> dict[str, Any] | None:
        lever = levers.of_flag(flag)
        if lever is not None and kind_of(flag.key) not in ("micro_batch", "grad_accum"):
            return lever_knob(flag, lever, levers)
        return draft_knob(flag, knob_product, style, cpus)

    left_out = one_knob_per_kind(every, given, knob_of)
    _note_left_out(draft, every, left_out)
    for flag in every:
        field_name = contract_field_of(flag)
        if field_name in ("num_steps", "num_tokens") and {"num_steps", "num_tokens"} & set(contract):
            continue  # the job's length is given one way already: the spec controls that one
        if field_name and field_name not in contract and (flag.name in given or _usable_default(field_name, flag)):
            contract[field_name] = flag.value
            placeholder = _step_placeholder(seen, draft) if field_name == "num_steps" else field_name
            step_offset = 1 if placeholder == "last_step" else step_offset
            if flag.name in given:
                template[flag.index] = in_place(flag, placeholder)
                continue
            from_help.add(field_name)
            origins[field_name] = flag.origin
            if field_name in ("num_steps", "seed"):
                tail += appended(flag, placeholder)
            continue
        lever = levers.of_flag(flag)
        knob = None if flag.name in left_out or (lever is not None and not lever.offered) else knob_of(flag)
        if knob is None:
            if kind_of(flag.key) == "optimizer" and len(flag.choices or ()) > 1:
                draft.notes.append(f"{flag.spelled} is not a knob: its values ({', '.join(map(str, flag.choices[:4]))}"
                                   ", ...) are other optimizers, which change what is trained; a knob may only "
                                   "switch between implementations of one algorithm")
            continue
        kname = knob_name(flag)
        if flag.name in given:
            knob = _as_typed(knob, flag)
            template[flag.index] = in_place(flag, kname)
            knob.pop("flag_style", None)
            if flag.style != "switch":
                knob.pop("flag")
            else:
                knob["flag_style"] = "switch"
            knob["placeholder"] = True
        else:
            draft.confirm[f"baseline.{kname}"] = (f"from {flag.origin}, not the command (passed at this value on "
                                                  "every run): is this what the job runs today?")
        baseline[kname] = knob.pop("baseline")
        knobs[kname] = knob
    if "num_steps" not in contract and "num_tokens" not in contract:
        draft.notes.append("CONFIRM command: neither the command nor --help names a step flag; add the job's "
                           "step flag with {num_steps} so that a trial runs a few steps")
    if split:
        draft.data["fixed_products"] = [{"knobs": [knob_name(mb), knob_name(ga)], "value": product}]
    elif mb is not None and gb is not None:
        draft.notes.append(f"{mb.spelled} keeps the global batch: the job derives its accumulation from "
                           f"{gb.spelled} ({gb.value} sequences per step)")
    elif mb is not None:
        draft.notes.append(f"{mb.spelled} is not a knob: without an accumulation flag it changes the global batch.")
    taken = {k.get("kind") for k in knobs.values()}
    placed, inserted = launcher_knobs(cmd, levers, template, taken)
    for kname, knob in {**placed, **env_knobs(cmd, levers, environ, taken)}.items():
        baseline[kname] = knob.pop("baseline")
        knobs[kname] = knob
        if knob.get("kind") == "processes" and split:
            _processes_in_product(draft, kname, baseline[kname])
    if inserted:
        template[cmd.entry_index:cmd.entry_index] = inserted
    processes = next((n for n, k in knobs.items() if k.get("kind") == "processes"), None)
    if mb is not None and gb is not None and not split and processes and knob_name(mb) in knobs:
        # the job derives its accumulation from the global batch over the processes' micro-batches
        draft.data.setdefault("constraints", []).append(f"{gb.value} % ({knob_name(mb)} * {processes}) == 0")
    constraints, notes = coupling_constraints(knobs, baseline, levers)
    draft.notes += notes + unoffered_notes(cmd, levers)
    if constraints:
        draft.data["constraints"] = draft.data.get("constraints", []) + constraints
    draft.data.update(name=name, workload_dir=".", repository="copy", command=template + tail, flag_style=style,
                      baseline=baseline)
    carried = {k["env"] for k in knobs.values() if k.get("env")}
    env = {k: v for k, v in cmd.env.items() if k not in carried}
    if env:
        draft.data["env"] = env
    draft.data["knobs"] = knobs
    return draft, CommandFacts(found=contract, from_help=frozenset(from_help), origins=origins, product=product,
                               step_offset=step_offset)


def batch_flags(flags: list[Flag]) -> tuple[Flag | None, Flag | None, Flag | None]:
    """(micro-batch, accumulation, global batch) among ``flags``, each where its value is a
    whole number: a micro-batch with an accumulation count, or with a global batch the job
    derives its accumulation from."""
    whole = [f for f in flags if isinstance(f.value, int) and not isinstance(f.value, bool)]
    mb = next((f for f in whole if kind_of(f.key) == "micro_batch"), None)
    ga = next((f for f in whole if kind_of(f.key) == "grad_accum"), None) if mb else None
    gb = next((f for f in whole if f.key in GLOBAL_BATCH_NAMES), None) if mb and not ga else None
    return mb, ga, gb


def typed_tokens_per_step(cmd: ParsedCommand, known: list[Flag]) -> int | None:
    """Tokens per optimizer step as the command's own numbers give them (micro-batch x
    accumulation, or the global batch, x processes x sequence length); None where one is
    missing."""
    given = {f.name for f in cmd.flags}
    every = cmd.flags + [f for f in known if f.name not in given]
    mb, ga, gb = batch_flags(every)
    sequences = mb.value * ga.value * (cmd.nproc or 1) if ga else gb.value if gb else None
    seq_len = next((f.value for f in every if contract_field_of(f) == "seq_len" and isinstance(f.value, int)), None)
    return sequences * seq_len if sequences and seq_len else None


def _note_left_out(draft: Draft, every: list[Flag], left_out: dict[str, Flag]) -> None:
    for kept in {f.name: f for f in left_out.values()}.values():
        names = [f.spelled for f in every if f.name in left_out and left_out[f.name] is kept]
        kind = kind_of(kept.key)
        why = ("two precision switches could both be on (--bf16 with --fp16 the Trainer rejects); fp16 is a knob "
               "only where the command turns it on, as CPUs run it poorly if at all" if kind == "precision" else
               f"two {kind} knobs could clash or be aliases of one setting")
        draft.notes.append(f"{', '.join(names)} {'is' if len(names) == 1 else 'are'} not a knob: {kept.spelled} is "
                           f"the one {kind} knob, since {why}")


def _usable_default(field_name: str, flag: Flag) -> bool:
    """Whether a contract flag the command does not give enters the spec with --help's
    default: an integer seed or a positive sequence length; any step flag, since a trial
    sets its own step count."""
    value = flag.value
    if field_name == "num_steps":
        return True
    return isinstance(value, int) and not isinstance(value, bool) and (value > 0 or field_name == "seed")


def _step_placeholder(seen: Observed, draft: Draft) -> str:
    """``{num_steps}`` where the dry run printed one loss per step it was given,
    ``{last_step}`` where it printed one more (a loop over 0..N inclusive)."""
    if seen.num_losses in (None, DRY_RUN_STEPS):
        return "num_steps"
    if seen.num_losses == DRY_RUN_STEPS + 1:
        draft.notes.append(f"the step flag is {{last_step}} (num_steps - 1): given {DRY_RUN_STEPS} steps, the dry "
                           f"run printed {seen.num_losses} losses (its loop runs 0..N inclusive)")
        return "last_step"
    draft.confirm["contract.num_steps"] = (
        f"PLACEHOLDER: given {DRY_RUN_STEPS} steps, the dry run printed {seen.num_losses} loss line(s), not one per "
        "step: make the job print its loss every step (a logging-interval flag of 1)")
    return "num_steps"


def _processes_in_product(draft: Draft, name: str, value: int) -> None:
    draft.data["fixed_products"][0]["knobs"].append(name)
    draft.data["fixed_products"][0]["value"] *= value
    draft.notes.append("CONFIRM fixed_products: micro-batch x accumulation x processes is the global batch "
                       "in sequences (if your script splits the batch over processes itself, drop "
                       f"{name})")


def changes_numerics(name: str, knob: dict[str, Any]) -> bool:
    return default_numerics(name, knob.get("kind")) == CHANGES
