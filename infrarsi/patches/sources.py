"""Code patches proposed during a campaign, and the gate every proposal passes.

After doctor, and again when the search stalls, the run stage asks a patch source for
candidates aimed at the measured bottleneck:

- ``LLMPatchSource``: the LLM endpoint of the spec (``adapters.llm``), shown the editable
  files, the contract, doctor's phase profile and the trials so far;
- ``BuiltinPatchSource``: the built-in library (``infra_patches/``), each patch matched by
  its ``meta.toml``: the phases it shortens against doctor's profile (or memory pressure
  for a memory saver), ``requires_text`` against the snapshot's files, ``pays_with``
  against the best config so far.

Every candidate goes through ``gate``: the same checks as a patch the user lists
(``patches.check_scope``: editable scope, locked files; applies to the snapshot), plus
"never proposed before" and "not already refused". A refused candidate costs no trial.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Protocol, Sequence

from infrarsi.backends import backend_of
from infrarsi.core.errors import InfrarsiError, PatchError
from infrarsi.core.knobs import Config
from infrarsi.core.trial import Outcome, TrialResult
from infrarsi.patches.patch import Patch, builtin_patches, check_scope

__all__ = ["BuiltinPatchSource", "GateVerdict", "LLMPatchSource", "PatchContext", "PatchSource",
           "gate", "patch_sources", "phase_shares"]

# A memory saver is worth proposing once the baseline's peak is this share of capacity.
MEMORY_PRESSURE = 0.7
# Candidates asked of a source per round.
PER_ROUND = 2


@dataclass(frozen=True, kw_only=True)
class PatchContext:
    """What a source sees: the contract's files and scope, doctor's profile, the trials."""

    workdir: Path
    editable_files: tuple[str, ...]
    editable: tuple[str, ...]
    locked: tuple[str, ...]
    description: str
    phases_s: Mapping[str, float]
    peak_memory_bytes: int
    memory_capacity_bytes: int
    step_time_s: float
    trials: tuple[TrialResult, ...] = ()
    known_knobs: tuple[str, ...] = ()

    @property
    def incumbent(self) -> TrialResult | None:
        ok = [r for r in self.trials if r.outcome is Outcome.OK]
        return min(ok, key=lambda r: r.step_time_s) if ok else None

    @property
    def memory_pressure(self) -> float:
        return self.peak_memory_bytes / self.memory_capacity_bytes if self.memory_capacity_bytes else 0.0


def phase_shares(phases_s: Mapping[str, float]) -> dict[str, float]:
    """Each phase's share of the profiled step time."""
    total = sum(v for v in phases_s.values() if v > 0)
    return {k: (v / total if total > 0 else 0.0) for k, v in phases_s.items()}


class PatchSource(Protocol):
    name: str

    def propose(self, ctx: PatchContext, exclude: set[str]) -> tuple[list[Patch], list[dict]]:
        """Candidates (not named in ``exclude``), and problems that produced no candidate."""


@dataclass
class BuiltinPatchSource:
    """The built-in library, ranked by the gain its metadata expects on this profile."""

    name: str = "builtin"
    library: list[Patch] = field(default_factory=builtin_patches)

    def score(self, patch: Patch, ctx: PatchContext) -> float:
        """Expected share of step time (or peak memory) saved; 0 when it does not match."""
        if not _preconditions_hold(patch, ctx.workdir):
            return 0.0
        shares = phase_shares(ctx.phases_s)
        time_gain = sum(shares.get(p, 0.0) for p in patch.phases if p != "memory") * (1 - patch.expected_time_effect)
        memory_gain = 0.0
        if "memory" in patch.phases and ctx.memory_pressure >= MEMORY_PRESSURE:
            memory_gain = ctx.memory_pressure * (1 - patch.expected_memory_effect)
        gain = max(time_gain, memory_gain, 0.0)
        best = ctx.incumbent
        needs = {k: v for k, v in patch.pays_with.items() if k in ctx.known_knobs}
        if best is not None and any(best.config.get(k) != v for k, v in needs.items()):
            gain *= 0.5  # the best config so far would not feel it
        return gain

    def propose(self, ctx: PatchContext, exclude: set[str]) -> tuple[list[Patch], list[dict]]:
        ranked = sorted(((self.score(p, ctx), p.name, p) for p in self.library if p.name not in exclude),
                        key=lambda t: (-t[0], t[1]))
        return [p for s, _, p in ranked if s > 0][:PER_ROUND], []


def _preconditions_hold(patch: Patch, workdir: Path) -> bool:
    texts = []
    for rel in patch.files_touched:
        path = Path(workdir) / rel
        if not path.is_file():
            return False
        texts.append(path.read_text(errors="replace"))
    return all(any(snippet in t for t in texts) for snippet in patch.requires_text)


@dataclass
class LLMPatchSource:
    """Patches from the spec's LLM endpoint; every failure is a recorded problem, not an error."""

    settings: Any  # adapters.llm.LLMSettings
    log_dir: Path | None = None
    name: str = "llm"
    num_asked: int = 0

    def propose(self, ctx: PatchContext, exclude: set[str]) -> tuple[list[Patch], list[dict]]:
        from infrarsi.adapters.llm import LLMClient

        self.num_asked += 1
        name = f"llm_{self.num_asked}"
        while name in exclude:
            self.num_asked += 1
            name = f"llm_{self.num_asked}"
        files = {rel: (Path(ctx.workdir) / rel).read_text(errors="replace") for rel in ctx.editable_files}
        try:
            proposal = LLMClient(self.settings, log_dir=self.log_dir).propose_patch(
                task_description(ctx), files, list(ctx.editable))
        except InfrarsiError as exc:  # no usable answer, or the endpoint refused the request
            return [], [{"name": name, "source": self.name, "reason": str(exc)}]
        try:
            patch = Patch(name=name, diff=proposal.unified_diff, title=proposal.title,
                          description=proposal.rationale, files_touched=tuple(proposal.files_touched),
                          expected_time_effect=proposal.expected_time_effect,
                          expected_memory_effect=proposal.expected_memory_effect,
                          preconditions="; ".join(proposal.preconditions), source=f"llm:{self.settings.model}")
        except PatchError as exc:
            return [], [{"name": name, "source": self.name, "reason": str(exc)}]
        return [patch], []


def task_description(ctx: PatchContext) -> str:
    """The LLM's brief: the contract, the measured profile and the trials so far."""
    shares = phase_shares(ctx.phases_s)
    profile = ", ".join(f"{k} {ctx.phases_s[k]:.3f} s ({shares[k]:.0%})" for k in sorted(ctx.phases_s))
    ok = sorted((r for r in ctx.trials if r.outcome is Outcome.OK), key=lambda r: r.step_time_s)[:5]
    failed = [r for r in ctx.trials if r.outcome is not Outcome.OK][-5:]
    lines = [
        f"Workload: {ctx.description}",
        f"Baseline step time {ctx.step_time_s:.4f} s; phase profile: {profile or 'not measured'}.",
        f"Peak memory {ctx.peak_memory_bytes / 2**20:.0f} MiB of {ctx.memory_capacity_bytes / 2**20:.0f} MiB.",
        f"Locked files (never touch): {', '.join(ctx.locked)}. The loss trajectory must stay the baseline's.",
        "Paths in the diff are relative to the folder of the files shown (a/model.py, b/model.py).",
        "Fastest trials so far:", *[f"- {r.step_time_s:.4f} s: {dict(r.config)}" for r in ok],
        "Recent failed trials:", *[f"- {r.outcome.value}: {r.reason[:200]}" for r in failed],
    ]
    return "\n".join(lines)


@dataclass(frozen=True, kw_only=True)
class GateVerdict:
    patch: Patch
    reason: str | None  # None: accepted
    conflicts: tuple[str, ...] = ()  # accepted patches it does not apply together with

    @property
    def accepted(self) -> bool:
        return self.reason is None


def gate(patch: Patch, contract: Any, accepted: Sequence[Patch], refused: set[str]) -> GateVerdict:
    """The user's patch gate for a proposal: scope, locked files, applies to the snapshot;
    plus no name or diff already taken, and never a patch refused or violated before."""
    from infrarsi.adapters.git_branch import check_patches_apply, repository_root

    if patch.name in refused or patch.name in {p.name for p in accepted}:
        return GateVerdict(patch=patch, reason=f"patch {patch.name!r} was proposed before")
    if any(p.diff.strip() == patch.diff.strip() for p in accepted):
        return GateVerdict(patch=patch, reason="the same diff is already a knob")
    problems = check_scope(patch, contract)
    if problems:
        return GateVerdict(patch=patch, reason="escapes the contract's scope: " + "; ".join(problems))
    repo = repository_root(contract.workdir)
    directory = Path(contract.workdir).resolve().relative_to(repo).as_posix()
    try:
        # Raises unless each applies on its own; returns the pairs that do not apply together.
        pairs = check_patches_apply(repo, {**{p.name: p.diff for p in accepted}, patch.name: patch.diff},
                                    directory=directory)
    except PatchError as exc:
        return GateVerdict(patch=patch, reason=f"does not apply to the snapshot: {exc}")
    conflicts = tuple(a if b == patch.name else b for a, b in pairs if patch.name in (a, b))
    return GateVerdict(patch=patch, reason=None, conflicts=conflicts)


def patch_sources(spec: Any, log_dir: Path | None) -> list[PatchSource]:
    """The LLM where the spec names an endpoint, the built-in library otherwise; none for
    the simulator (no code) or when ``search.patch_rounds`` is 0."""
    if not backend_of(spec).runs_code or getattr(spec.search, "patch_rounds", 1) <= 0:
        return []
    if spec.llm is not None:
        from infrarsi.adapters.llm import LLMSettings

        return [LLMPatchSource(LLMSettings(**spec.llm.model_dump()), log_dir=log_dir)]
    return [BuiltinPatchSource()]


def measurement_config(patch: Patch, ctx: PatchContext, baseline: Config) -> Config:
    """The config that measures a new patch: the best ok config so far (else the baseline)
    with the patch on."""
    best = ctx.incumbent
    base = dict(best.config) if best is not None else dict(baseline)
    return {**base, patch.knob: True}

