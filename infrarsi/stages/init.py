"""init: validate the spec, fix where trials run, hash the locked files, freeze the contract."""

from __future__ import annotations

import datetime as dt
import secrets
from pathlib import Path

from infrarsi import hardware
from infrarsi.contract import Contract, hash_files, matching_files
from infrarsi.errors import ResumeError
from infrarsi.spec import CampaignSpec, load_spec
from infrarsi.workspace import CampaignDir

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

    if spec.backend == "sim":  # no code: the repository only carries the promoted config
        cdir.snapshot.mkdir(parents=True, exist_ok=True)
        (cdir.snapshot / "README.md").write_text(f"Simulated workload {spec.sim_workload}.\n")
        return snapshot(cdir.snapshot, cdir.root / "sim-repo")
    if spec.repository == "auto" and repository_root(spec.workload_dir) is not None:
        return spec.workload_dir
    return snapshot(spec.workload_dir, cdir.snapshot / spec.workload_dir.name)


def init_campaign(spec_path: Path | None, out_root: Path, *, campaign_id: str | None = None) -> tuple[Contract, CampaignDir]:
    spec_path = Path(spec_path) if spec_path else builtin_spec_path()
    spec = load_spec(spec_path)
    campaign_id = campaign_id or new_campaign_id(spec)
    cdir = CampaignDir(Path(out_root).resolve() / campaign_id)
    if cdir.contract.exists():
        raise ResumeError(f"{cdir.root} already holds a campaign; resume it with --resume {cdir.root}")
    cdir.root.mkdir(parents=True, exist_ok=True)
    workdir = _workdir(spec, cdir)
    c = spec.contract
    locked = [] if spec.backend == "sim" else matching_files(workdir, c.locked)
    editable = [] if spec.backend == "sim" else [p for p in matching_files(workdir, c.editable) if p not in locked]
    fp = hardware.fingerprint()
    contract = Contract(
        campaign_id=campaign_id, spec=spec, spec_source=str(spec_path.resolve()), workdir=workdir,
        locked_hashes=hash_files(workdir, locked), editable_files=tuple(editable),
        source_hash=_source_hash(workdir, sorted(set(locked) | set(editable))),
        hardware=fp, hardware_hash=hardware.fingerprint_hash(fp),
        created_at=dt.datetime.now(dt.timezone.utc).isoformat(),
        extra={"sim_workload": spec.sim_workload} if spec.backend == "sim" else {})
    cdir.write_json(cdir.contract, contract.to_json())
    return contract, cdir


def load_campaign(root: Path) -> tuple[Contract, CampaignDir]:
    cdir = CampaignDir(Path(root).resolve())
    if not cdir.contract.exists():
        raise ResumeError(f"{cdir.root} has no contract.json: it is not a campaign folder (or init never finished)")
    return Contract.from_json(cdir.read_json(cdir.contract)), cdir


def _source_hash(root: Path, rel_paths: list[str]) -> str:
    import hashlib

    h = hashlib.sha256()
    for rel, digest in sorted(hash_files(root, rel_paths).items()):
        h.update(f"{rel}:{digest}\n".encode())
    return h.hexdigest()[:16]
