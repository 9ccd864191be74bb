"""init: validate the spec, fix where trials run, hash the locked files, freeze the contract."""

from __future__ import annotations

import datetime as dt
import secrets
from dataclasses import dataclass
from pathlib import Path

from infrarsi.backends import backend_of
from infrarsi.contract.freeze import Contract
from infrarsi.contract.spec_load import load_spec
from infrarsi.core.errors import ResumeError, SpecError
from infrarsi.core.files import hash_files, matching_files
from infrarsi.core.options import CampaignOptions
from infrarsi.core.spec import CampaignSpec
from infrarsi.core.workspace import CampaignDir, default_campaigns_dir, default_tracking_uri
from infrarsi.harness import machine
from infrarsi.record.campaign import read_contract, write
from infrarsi.stages.probes import probe_outside_systems

BUILTIN_SPEC = Path(__file__).resolve().parents[2] / "workloads" / "gpt" / "campaign.toml"


def builtin_spec_path() -> Path:
    return BUILTIN_SPEC


def new_campaign_id(spec: CampaignSpec) -> str:
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%d-%H%M%S")
    return f"{spec.name}-{stamp}-{secrets.token_hex(2)}"


def _workdir(spec: CampaignSpec, cdir: CampaignDir) -> Path:
    """Where trials run. ``copy`` snapshots the workload folder into the campaign folder
    as its own git repository (``repo/<folder name>``), so the branch lands there and the
    source is never touched; ``auto`` runs in place and branches in the enclosing repository, or copies
    when there is none."""
    from infrarsi.adapters.git_branch import repository_root, snapshot

    if not backend_of(spec).runs_code:  # the repository only carries the promoted config
        cdir.snapshot.mkdir(parents=True, exist_ok=True)
        (cdir.snapshot / "README.md").write_text(f"Simulated workload {spec.sim_workload}.\n")
        return snapshot(cdir.snapshot, cdir.root / "sim-repo")
    if spec.repository == "auto" and repository_root(spec.workload_dir) is not None:
        return spec.workload_dir
    return snapshot(spec.workload_dir, cdir.snapshot / spec.workload_dir.name)


def git_spec(spec: str) -> tuple[str, str, str | None] | None:
    """``(url, path in the repository, ref)`` for a spec given as ``URL#path[@ref]``;
    None for a local path."""
    if "://" not in spec and not spec.startswith("git@"):
        return None
    url, _, rest = spec.partition("#")
    path, _, ref = (rest or "campaign.toml").partition("@")
    return url, path, ref or None


def fetch_spec(spec: str | None, out_root: Path) -> tuple[Path, Path | None]:
    """The spec file to load, and the checkout made for it (None unless ``spec`` is a git
    URL: then a shallow clone under ``out_root/.specs``, where the campaign runs in place)."""
    if not spec:
        return builtin_spec_path(), None
    remote = git_spec(spec)
    if remote is None:
        return Path(spec), None
    from infrarsi.adapters.git_branch import clone

    url, rel, ref = remote
    checkout = Path(out_root).resolve() / ".specs" / f"{dt.datetime.now(dt.timezone.utc):%Y%m%d-%H%M%S}-{secrets.token_hex(3)}"
    checkout.parent.mkdir(parents=True, exist_ok=True)
    clone(url, checkout, ref=ref)
    return checkout / rel, checkout


def resolved_options(options: CampaignOptions, spec: CampaignSpec) -> dict:
    """What the campaign folder remembers: the proposer and budget actually used, the
    MLflow store actually logged to, and the other overrides given."""
    from infrarsi.proposers import proposer_names
    from infrarsi.stages.run.reserve import check_cap

    proposer = options.proposer or spec.search.proposer
    if proposer not in proposer_names():
        raise SpecError(f"search.proposer: expected one of {proposer_names()}, found {proposer!r}; "
                        "fix the spec or pass --proposer")
    tracking_uri = options.tracking_uri or default_tracking_uri()
    if tracking_uri.startswith("sqlite:///"):
        Path(tracking_uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    budget = options.search_budget(spec)
    check_cap(spec, budget)  # a cap that leaves the search nothing stops here, before any trial
    return {**options.persisted(), "proposer": proposer, "budget": budget, "tracking_uri": tracking_uri}


def start_campaign(options: CampaignOptions) -> tuple[Contract, CampaignDir, CampaignOptions]:
    """Init a new campaign or load the one to resume; return it with its options resolved
    (the remembered ones filling what ``options`` leaves unset). Everything that can be
    checked is checked before the campaign folder exists."""
    if options.resume:
        contract, cdir = load_campaign(Path(options.resume))
        remembered = cdir.remembered_options()
        resolved = options.over(remembered)
        now = resolved_options(resolved, contract.spec)
        warnings = probe_outside_systems(contract.spec, now)
        if now != remembered:
            cdir.write_json(cdir.options, now)
        for source, message in warnings:
            cdir.add_warning(source, message)
        return contract, cdir, resolved.model_copy(update=now)
    out_root = Path(options.out) if options.out else default_campaigns_dir()
    spec_path, checkout = fetch_spec(options.spec, out_root)
    try:
        contract, cdir = init_campaign(spec_path, out_root, campaign_id=options.campaign_id, options=options)
    except BaseException:
        if checkout is not None:  # a spec that fails init leaves no checkout behind
            import shutil

            shutil.rmtree(checkout, ignore_errors=True)
        raise
    return contract, cdir, options.model_copy(update=cdir.remembered_options())


def init_campaign(spec_path: Path | None, out_root: Path, *, campaign_id: str | None = None,
                  options: CampaignOptions | None = None) -> tuple[Contract, CampaignDir]:
    spec_path = Path(spec_path) if spec_path else builtin_spec_path()
    spec = load_spec(spec_path)
    remembered = resolved_options(options or CampaignOptions(), spec)
    campaign_id = campaign_id or new_campaign_id(spec)
    cdir = CampaignDir(Path(out_root).resolve() / campaign_id)
    if cdir.contract.exists():
        raise ResumeError(f"{cdir.root} already holds a campaign; resume it with --resume {cdir.root}")
    warnings = probe_outside_systems(spec, remembered)  # an unreachable system stops here, before the folder
    cdir.root.mkdir(parents=True, exist_ok=True)
    cdir.write_json(cdir.options, remembered)
    for source, message in warnings:
        cdir.add_warning(source, message)
    workdir = _workdir(spec, cdir)
    c, code = spec.contract, backend_of(spec).runs_code
    locked = matching_files(workdir, c.locked) if code else []
    editable = [p for p in matching_files(workdir, c.editable) if p not in locked] if code else []
    fp = machine.fingerprint()
    extra: dict = {}
    if spec.patches:
        extra["patches"], conflicts = _gated_patches(spec, spec_path, workdir, locked)
        # Patches that do not apply together are never switched on together.
        spec = spec.model_copy(update={"constraints": [*spec.constraints, *conflicts]})
    contract = Contract(
        campaign_id=campaign_id, spec=spec, spec_source=str(spec_path.resolve()), workdir=workdir,
        locked_hashes=hash_files(workdir, locked), editable_files=tuple(editable),
        source_hash=_source_hash(workdir, sorted(set(locked) | set(editable))),
        hardware=fp, hardware_hash=machine.fingerprint_hash(fp),
        created_at=dt.datetime.now(dt.timezone.utc).isoformat(),
        extra=extra)
    write(cdir, cdir.contract, contract)
    return contract, cdir


def _gated_patches(spec: CampaignSpec, spec_path: Path, workdir: Path, locked: list[str]
                   ) -> tuple[list[dict], list[str]]:
    """Every listed patch after the gate (inside the editable scope, applies to the snapshot;
    a patch that fails stops init, before any trial), and a constraint for each pair of
    patches that do not apply together."""
    from infrarsi.adapters.git_branch import check_patches_apply, repository_root
    from infrarsi.patches.patch import load_patches, require_in_scope

    patches = load_patches(spec.patches, spec_path.resolve().parent)
    scope = _Scope(spec=spec, locked_hashes=dict.fromkeys(locked, ""))
    for patch in patches:
        require_in_scope(patch, scope)
    repo = repository_root(workdir)
    conflicts = check_patches_apply(repo, {p.name: p.diff for p in patches},
                                    directory=Path(workdir).resolve().relative_to(repo).as_posix())
    knobs = {p.name: p.knob for p in patches}
    return [p.to_json() for p in patches], [f"not ({knobs[a]} and {knobs[b]})" for a, b in conflicts]


@dataclass(frozen=True)
class _Scope:  # what check_scope reads of a contract, before the contract exists
    spec: CampaignSpec
    locked_hashes: dict


def load_campaign(root: Path) -> tuple[Contract, CampaignDir]:
    cdir = CampaignDir(Path(root).resolve())
    if not cdir.contract.exists():
        raise ResumeError(f"{cdir.root} has no contract.json: it is not a campaign folder (or init never finished)")
    return read_contract(cdir), cdir


def _source_hash(root: Path, rel_paths: list[str]) -> str:
    import hashlib

    h = hashlib.sha256()
    for rel, digest in sorted(hash_files(root, rel_paths).items()):
        h.update(f"{rel}:{digest}\n".encode())
    return h.hexdigest()[:16]
