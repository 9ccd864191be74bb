"""The locked task contract: what no candidate may change, frozen and hashed at init."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from infrarsi.contract.spec_load import parse_spec
from infrarsi.core.files import sha256_file
from infrarsi.core.serial import Record
from infrarsi.core.spec import CampaignSpec


@dataclass(frozen=True, kw_only=True)
class Contract(Record):
    campaign_id: str
    spec: CampaignSpec
    spec_source: str
    workdir: Path  # where trials run: the target repository or its snapshot
    locked_hashes: Mapping[str, str]
    editable_files: tuple[str, ...]
    source_hash: str  # every editable and locked file: the workload's code as locked
    hardware: Mapping[str, Any]
    hardware_hash: str
    created_at: str
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def spec_hash(self) -> str:
        return hashlib.sha256(self.spec.model_dump_json().encode()).hexdigest()[:16]

    @property
    def contract_hash(self) -> str:
        """What doctor's cache key needs: the workload as locked, not where it lives."""
        blob = json.dumps({"spec": self.spec.model_dump(mode="json", exclude={"workload_dir", "budget", "search"}),
                           "locked": dict(self.locked_hashes)}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def changed_locked_files(self, root: Path | None = None) -> list[str]:
        """Locked files that are missing or differ from their hash at init."""
        root = Path(root or self.workdir)
        changed = []
        for rel, digest in self.locked_hashes.items():
            path = root / rel
            if not path.is_file() or sha256_file(path) != digest:
                changed.append(rel)
        return changed

    def to_json(self) -> dict[str, Any]:
        """With the spec's and the contract's hashes, for a reader of the file (loading ignores them)."""
        return {**super().to_json(), "spec_hash": self.spec_hash, "contract_hash": self.contract_hash}

    @classmethod
    def upgrade(cls, data: Mapping[str, Any]) -> Mapping[str, Any]:
        """The spec is parsed as init parsed it, its paths relative to its workload folder."""
        if not isinstance(data.get("spec"), Mapping):
            return data
        spec_data = dict(data["spec"])
        base = Path(spec_data.pop("workload_dir"))
        return {**data, "spec": parse_spec({**spec_data, "workload_dir": "."}, source=data["spec_source"],
                                           base_dir=base)}
