"""The contract, metrics and calibration ``infrarsi init`` writes, each guess checked
against the command's own numbers and what the dry runs printed."""

from __future__ import annotations

import math
from typing import Any

from infrarsi.discover.draft import (MAX_TRIAL_STEPS, MIN_TRIAL_STEPS, CommandFacts, Draft, Observed,
                                    changes_numerics, contract_field_of)
from infrarsi.discover.command import ParsedCommand

# An honest split of the global batch that moves a printed loss by more than this (or by more
# than one last printed digit and a half, where the job rounds coarser) at any step both dry
# runs printed means the job prints a micro-batch's loss, not the global batch's: compare
# moving means.
SPLIT_MOVES_LOSS = 1e-4


def contract_and_metrics(draft: Draft, cmd: ParsedCommand, seen: Observed, facts: CommandFacts) -> None:
    """Fill the draft's contract, metrics, calibration and reproduce tables."""
    found, from_help, product = facts.found, facts.from_help, facts.product
    sequences = product * (cmd.nproc or 1) if product and draft.data.get("fixed_products") else product
    seq_len, seq_why = _seq_len(found, facts.origins, seen, sequences)
    tokens, tokens_why, line = _tokens(seen, sequences, seq_len, found)
    if seq_len is None and tokens_why.startswith("derived") and sequences and tokens % sequences == 0:
        seq_len, seq_why = tokens // sequences, f"tokens per step over {sequences} sequences per step"
    steps = found.get("num_steps")
    if steps is None and isinstance(found.get("num_tokens"), int) and tokens > 1:
        steps = found["num_tokens"] // tokens
    _job_length(draft, cmd, facts, steps)
    steps = min(max(steps, MIN_TRIAL_STEPS), MAX_TRIAL_STEPS) if isinstance(steps, int) else MAX_TRIAL_STEPS
    signal, signal_why = _loss_signal(seen, product)
    seed = found.get("seed", 1234)
    locked = _globs(seen.files_read) or [cmd.script or "PLACEHOLDER"]
    c = {"seq_len": int(seq_len or 1), "global_batch_tokens": int(tokens), "num_steps": steps,
         "warmup_steps": 2 if steps > 3 else 1, "seed": int(seed), "loss_signal": signal, "locked": locked}
    draft.data["metrics"] = _metrics(seen, draft, line, tokens)
    draft.data["contract"] = c
    draft.confirm.update({
        "contract.seq_len": f"tokens per sequence, {seq_why}",
        "contract.global_batch_tokens": f"tokens per optimizer step, {tokens_why}",
        "contract.num_steps": draft.confirm.get("contract.num_steps",
                                                "optimizer steps per trial, warm-up included (keep it short)"),
        "contract.loss_signal": signal_why,
        "contract.locked": ("the files the dry run read under this folder (code, config, data): hashed around "
                            "every trial, so nothing a trial does may change them" if seen.files_read else
                            "PLACEHOLDER: no dry run saw what the job reads: list its model code, data and config"),
    })
    if "seed" not in found:
        draft.confirm["contract.seed"] = ("PLACEHOLDER: the command passes no seed; add the script's seed flag as "
                                          "--seed={seed} (say) so verification's canary seeds reach the job")
    elif "seed" in from_help:
        draft.confirm["contract.seed"] = (f"from {facts.origins.get('seed', '--help')}, not the command (init adds the "
                                          "flag at this value)")
    calibration = _calibration(draft)
    if calibration:
        draft.data["calibration"] = calibration
    if seen.first_loss is not None or seen.fact_lines:
        draft.data["reproduce"] = {k: v for k, v in {
            "command": cmd.typed or [*(f"{k}={v}" for k, v in cmd.env.items()), *cmd.argv],
            "first_loss": seen.first_loss,
            "tokens_per_step": line.tokens if line else None, "lines": list(seen.fact_lines)}.items()
            if v not in (None, [])}
    draft.data["device"] = {"memory_capacity": "8GiB"}
    draft.confirm["device.memory_capacity"] = "per trial: on CPU the resident memory above which a trial is an OOM"
    draft.data["budget"] = {"num_trials": 12, "trial_timeout_s": 300, "doctor_repeats": 3, "num_finalists": 1,
                            "verify_pairs": 5}


def _job_length(draft: Draft, cmd: ParsedCommand, facts: CommandFacts, steps: Any) -> None:
    """``objective.job_steps``: the optimizer steps of the run the command types (its step
    flag, plus one for a loop over 0..N inclusive, or its tokens over a step's), so that a
    change with a start-up cost (compile) must repay it over the user's run."""
    typed = {"num_steps", "num_tokens"} - facts.from_help
    length = steps + facts.step_offset if isinstance(steps, int) and steps > 0 and typed & set(facts.found) else None
    if length is None:
        draft.notes.append("CONFIRM objective: the command does not say how many steps the real run takes; add "
                           "[objective] job_steps = <steps> so that start-up costs (compile) are weighed against "
                           "the run that pays them (unset: per-step time alone)")
        return
    flag = next((f.spelled for f in cmd.flags if contract_field_of(f) in typed), "the step flag")
    how = (f"{flag} {facts.found['num_steps']} typed, and the loop runs 0..N inclusive" if facts.step_offset
           else f"{flag} as typed" if "num_steps" in facts.found
           else f"{flag} {facts.found.get('num_tokens')} over the tokens of one step")
    draft.data["objective"] = {"job_steps": int(length)}
    draft.confirm["objective.job_steps"] = (f"the real run's optimizer steps ({how}): a change with a start-up "
                                            "cost must repay it over these")


def _globs(files: tuple[str, ...], most: int = 12) -> list[str]:
    """The files as written, a folder of more than ``most`` of them as ``folder/**``."""
    by_folder: dict[str, list[str]] = {}
    for f in files:
        by_folder.setdefault(f.rpartition("/")[0], []).append(f)
    out = []
    for folder, names in sorted(by_folder.items()):
        out += [f"{folder}/**"] if folder and len(names) > most else names
    return out


def _seq_len(found: dict, origins: dict[str, str], seen: Observed, sequences: int | None) -> tuple[int | None, str]:
    seq_len = found.get("seq_len")
    if seq_len is not None:
        return seq_len, (f"from {origins['seq_len']}, not the command" if "seq_len" in origins
                         else "from the command")
    lines = [t for t in seen.patterns.tokens_lines if sequences and t.tokens % sequences == 0]
    if len({t.tokens for t in lines}) == 1:
        return lines[0].tokens // sequences, (f"derived from the dry run's line '{lines[0].line}' over {sequences} "
                                              "sequences per step")
    return None, "PLACEHOLDER: neither the command nor --help gives it; write the job's tokens per sequence"


def _tokens(seen: Observed, sequences: int | None, seq_len: int | None, found: dict[str, Any]
            ) -> tuple[int, str, Any]:
    """(tokens per step, why, the tokens line that states it or None). A printed figure is
    accepted only where it equals micro-batch x accumulation x sequence length x processes;
    for a job whose length is counted in tokens, the tokens it was given over the losses it
    printed are a step's tokens."""
    lines = seen.patterns.tokens_lines
    total = found.get("num_tokens")
    if not (sequences and seq_len) and isinstance(total, int) and seen.num_losses and total % seen.num_losses == 0:
        return total // seen.num_losses, (f"derived: the dry run, given {total} tokens, printed {seen.num_losses} "
                                          "losses, one per step"), None
    if sequences and seq_len:
        computed = sequences * seq_len
        line = next((t for t in lines if t.tokens == computed), None)
        if line is not None:
            return computed, (f"printed by the dry run ('{line.line}') and equal to the command's {sequences} "
                              f"sequences x {seq_len} tokens"), line
        other = f"; the dry run's tokens lines said {sorted({t.tokens for t in lines})}, which do not" if lines else ""
        return computed, f"computed: {sequences} sequences per step x seq_len {seq_len}{other}", None
    listed = (f"; the dry run printed {', '.join(repr(t.line) for t in lines[:3])}, which the command's own numbers "
              "cannot check") if lines else ""
    return (sequences or 1) * (seq_len or 1), f"PLACEHOLDER: write the job's tokens per step{listed}", None


def _loss_signal(seen: Observed, product: int | None) -> tuple[str, str]:
    guide = ("'step' where the printed loss is the mean over the whole global batch (a Hugging Face Trainer's); "
             "'window' (a moving mean over contract.loss_window steps) where it is one micro-batch's (nanoGPT's); "
             "'eval' to compare the eval losses. Doctor checks it: docs/loss-contract.md")
    split = seen.split
    if split is None:
        return "step", guide
    bar = max(SPLIT_MOVES_LOSS, 1.5 * split.resolution)
    where = (f"over the {split.num_compared} steps both dry runs printed, at most {split.moved:.1e} apart "
             f"(step {split.at_step} of the printed losses)")
    if split.moved <= bar:
        return "step", (f"an honest split of the global batch printed the same losses {where}, within "
                        f"{bar:.1e} (one last printed digit or {SPLIT_MOVES_LOSS:.0e}): the printed loss is the "
                        f"global batch's. {guide}")
    return "window", (f"an honest split of the global batch moved the printed loss by {split.moved:.1%} at step "
                      f"{split.at_step} of the {split.num_compared} both dry runs printed: the job prints a "
                      f"micro-batch's loss, so moving means are compared. {guide}")


def _metrics(seen: Observed, draft: Draft, line: Any, tokens: int) -> dict[str, Any]:
    p = seen.patterns
    out: dict[str, Any] = {"source": "log", "stream": "both"}
    if p.step_pattern:
        out["step_pattern"] = p.step_pattern
        draft.notes.append(f"step_pattern was guessed from {p.num_step_lines} lines like: {p.step_example}")
    else:
        out["step_pattern"] = r"step (?P<step>\d+).*loss (?P<loss>[-+0-9.eE]+)"
        draft.confirm["metrics.step_pattern"] = "no loss line was found in the dry run: write the regex"
    if p.eval_pattern:
        out["eval_pattern"] = p.eval_pattern
    if line is not None:
        out["tokens_pattern"] = line.pattern
    else:
        out["tokens_per_step"] = tokens
        draft.confirm["metrics.tokens_per_step"] = "the job prints no tokens line that checks out: a declared constant"
    return out


def _calibration(draft: Draft) -> list[dict[str, Any]]:
    """Honest variants that calibrate the loss contract: the extreme splits of the fixed
    product in the baseline's numerics (the tolerance must cover every split between them),
    and one run per numerics-changing knob at its other value."""
    knobs, baseline, out = draft.data["knobs"], draft.data["baseline"], []
    micro = [n for n, k in knobs.items() if k.get("kind") == "micro_batch"]
    if micro and not draft.data.get("fixed_products"):  # the job derives accumulation from a global batch
        values = [v for v in knobs[micro[0]]["values"] if v != baseline[micro[0]]]
        out += [{micro[0]: v} for v in values[:1] + values[1:][-1:]]
    for fp in draft.data.get("fixed_products", ())[:1]:
        mb, ga = fp["knobs"][:2]
        rest = math.prod(baseline[k] for k in fp["knobs"][2:])
        splits = [{mb: m, ga: fp["value"] // rest // m} for m in knobs[mb]["values"]
                  if (fp["value"] // rest) % m == 0 and fp["value"] // rest // m in knobs[ga]["values"]
                  and m != baseline[mb]]
        # The smallest micro-batch and the largest bound how far reordering moves a loss the
        # job prints for the whole batch; a micro-batch's loss (window) moves with what each
        # split happens to draw, so every split calibrates it.
        window = draft.data["contract"].get("loss_signal") == "window"
        out += splits if window else splits[:1] + splits[1:][-1:]
    for name, knob in knobs.items():
        if changes_numerics(name, knob):
            other = next((v for v in knob["values"] if v != baseline[name]), None)
            if other is not None:
                out.append({name: other})
    if out:
        which = ("every split" if draft.data["contract"].get("loss_signal") == "window" else "the extreme splits")
        draft.notes.append(f"calibration: {which} of the global batch and each precision's other value "
                           "calibrate the loss tolerance (docs/loss-contract.md)")
    return out
