"""apply: stage the promoted config as a git branch in the target repository.

The branch holds ``infrarsi_promoted.toml`` next to the workload, with the promoted knob
values, the launch command that carries them and the evidence, plus the code change of
every patch the promoted config switches on; the commit message carries the audit. The user's
checkout is never touched (a separate worktree). The file is written by tomlkit, so any value
(quotes, inf, NaN) reads back as written; TOML has no null, so a value not set (no job length
declared, no canary verdict) is left out and named in a comment.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

import tomlkit

from infrarsi.contract.freeze import Contract
from infrarsi.core.workspace import CampaignDir
from infrarsi.harness.command import render_command
from infrarsi.record.campaign import read_minimize
from infrarsi.record.doctor import DoctorReport
from infrarsi.record.minimize import MinimizeReport
from infrarsi.record.verification import Verdict, VerificationReport

PROMOTED_FILE = "infrarsi_promoted.toml"


def _table(values: Mapping[str, Any], *, inline: bool = False) -> Any:
    """A TOML table of ``values``. TOML has no null: a key whose value is None is left out
    and, in a block table, named in a comment so that a reader sees it was not set."""
    table = tomlkit.inline_table() if inline else tomlkit.table()
    for key, value in values.items():
        if value is not None:
            table.add(key, value)
        elif not inline:
            table.add(tomlkit.comment(f"{key}: not set"))
    return table


def promoted_file(contract: Contract, doctor: DoctorReport, verification: VerificationReport) -> str:
    v = verification.promoted
    assert v is not None
    spec = contract.spec
    argv, env = render_command(spec, spec.space, v.config)
    argv = ["python" if a == argv[0] and spec.command[0] == "{python}" else a for a in argv]
    doc = tomlkit.document()
    doc.add(tomlkit.comment(f"Promoted by infrarsi campaign {contract.campaign_id}."))
    doc.add(tomlkit.comment(f"Verified speedup {v.speedup:.3f}x (90% CI {v.ci_low:.3f}-{v.ci_high:.3f}) "
                            "over the baseline."))
    doc.add(tomlkit.nl())
    doc.add("config", _table(v.config))
    doc.add("launch", _table({"command": argv, "env": _table(env, inline=True)}))
    doc.add("evidence", _table({
        "campaign_id": contract.campaign_id, "contract_hash": contract.contract_hash,
        "baseline_step_time_s": round(doctor.step_time_s, 6), "speedup": round(v.speedup, 4),
        "ci_low": round(v.ci_low, 4), "ci_high": round(v.ci_high, 4),
        "step_speedup": round(v.step_speedup or v.speedup, 4),
        "job_steps": None if v.job_steps is None else round(v.job_steps),
        "canary_effective": verification.canary_effective,
        "pairs": [list(p) for p in v.pairs]}))
    return tomlkit.dumps(doc)


def _canary_line(verification: VerificationReport, v: Verdict) -> str:
    if verification.canary_effective is False:
        return f"- NOT CHECKED: {verification.canary_note}"
    return f"- canary seeds of the pairs: {list(v.canary_seeds)}"


def _objective_line(v: Verdict) -> str:
    if v.job_steps is None:
        return "Objective: step time (no job length declared; start-up not counted)."
    return (f"Objective: the job's total time over {v.job_steps:,.0f} steps, start-up included "
            f"(per step: {v.step_speedup:.2f}x).")


def _contribution_lines(minimize: MinimizeReport | None) -> list[str]:
    if not minimize or not minimize.contributions:
        return []
    out = ["", "Each change (contribution > 1: it pays; measured by leaving it out, or predicted by the "
           "time model):"]
    for c in minimize.contributions:
        share = "-" if c.contribution is None else f"{c.contribution:.2f}x"
        ci = "" if c.ci_low is None else f" (90% CI {c.ci_low:.2f}-{c.ci_high:.2f})"
        state = "kept" if c.kept else "DROPPED"
        ground = f" ({c.ground})" if c.ground else ", inert in calibration" if c.inert else ""
        out.append(f"- {c.knob}={c.value}: {share}{ci} {c.source}, {state}{ground}")
    return out


def commit_message(contract: Contract, doctor: DoctorReport, verification: VerificationReport,
                   minimize: MinimizeReport | None = None) -> str:
    v = verification.promoted
    # A patch knob added during the run is off in a baseline recorded before it existed.
    changed = {k: val for k, val in v.config.items()
               if doctor.baseline.get(k, False if k.startswith("patch_") else None) != val}
    return "\n".join([
        f"infrarsi: promote {', '.join(f'{k}={val}' for k, val in changed.items())}",
        "",
        f"Campaign {contract.campaign_id} verified a {v.speedup:.2f}x speedup "
        f"(90% CI {v.ci_low:.2f}-{v.ci_high:.2f}) in {len(v.pairs)} interleaved A/B pairs "
        f"against the baseline ({doctor.step_time_s * 1000:.1f} ms/step), clearing 1 + the practical margin "
        f"{verification.margin:.1%}.",
        _objective_line(v),
        *_contribution_lines(minimize),
        "",
        "Audit:",
        f"- contract {contract.contract_hash}; locked files unchanged: {', '.join(contract.locked_hashes) or '-'}",
        f"- loss within {doctor.loss_tolerance:.2%} of the baseline on every verification run",
        _canary_line(verification, v),
        f"- baseline config: {json.dumps(doctor.baseline)}",
        f"- hardware: {contract.hardware_hash}",
    ]) + "\n"


def run_apply(contract: Contract, cdir: CampaignDir, doctor: DoctorReport, verification: VerificationReport,
              *, parent_run_id: str | None = None) -> dict[str, Any]:
    apply_json = cdir.root / "apply.json"
    if apply_json.exists():
        return cdir.read_json(apply_json)
    result: dict[str, Any] = {"branch": None, "commit": None, "mlflow_parent_run_id": parent_run_id}
    if verification.promoted is not None:
        from infrarsi.adapters.git_branch import repository_root, stage_branch

        repo = repository_root(contract.workdir)
        rel_dir = Path(contract.workdir).resolve().relative_to(repo)
        branch = f"infrarsi/{contract.campaign_id}"
        from infrarsi.patches.patch import contract_patches, enabled_patches

        patches = enabled_patches(verification.promoted.config, contract_patches(contract))
        commit = stage_branch(repo, branch, files={(rel_dir / PROMOTED_FILE).as_posix():
                                                   promoted_file(contract, doctor, verification)},
                              patches={p.name: p.diff for p in patches}, directory=rel_dir.as_posix(),
                              message=commit_message(contract, doctor, verification, read_minimize(cdir)),
                              # the branch is this campaign's own: one left by a campaign killed
                              # before apply.json was written is staged again, not an error
                              replace=True)
        result.update(branch=branch, commit=commit, repository=str(repo))
    cdir.write_json(apply_json, result)
    return result
