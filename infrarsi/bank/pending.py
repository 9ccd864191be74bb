"""Campaign records waiting for their bank: a campaign that ends while its bank cannot
be written keeps its record here (``bank-pending.jsonl`` in the infrarsi data folder, one
JSON line per record with the bank's location), and the next campaign that opens that
bank delivers it first (``deliver``, called by the campaign's start probe)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from infrarsi.bank.campaign import campaign_record
from infrarsi.bank.records import BankStore, record_from_json, record_to_json
from infrarsi.bank.store import bank_location, open_bank
from infrarsi.core.errors import BankUnavailableError
from infrarsi.core.workspace import CampaignDir, data_dir


def pending_path() -> Path:
    return data_dir() / "bank-pending.jsonl"


def _read() -> list[dict]:
    path = pending_path()
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _write(entries: list[dict]) -> None:
    path = pending_path()
    tmp = path.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(json.dumps(e, sort_keys=True) + "\n" for e in entries))
    os.replace(tmp, path)


def record_or_hold(setting: str | None, cdir: CampaignDir) -> str | None:
    """Record the finished campaign of ``cdir`` in the bank ``setting`` names; its id, or
    None with the bank off. A bank that cannot be written keeps the record pending (a
    warning in the campaign folder says where) instead of failing a finished campaign."""
    location = bank_location(setting)
    if location is None:
        return None
    rec = campaign_record(cdir)
    try:
        bank = open_bank(location)
        assert bank is not None  # the location says the bank is on
        bank.add(rec)
    except BankUnavailableError as exc:
        pending_path().parent.mkdir(parents=True, exist_ok=True)
        with pending_path().open("a") as fh:
            fh.write(json.dumps({"bank": location, "record": record_to_json(rec)}, sort_keys=True) + "\n")
        cdir.add_warning("bank", f"{exc}. The campaign's record is kept in {pending_path()} and goes into the bank "
                                 "when the next campaign that uses it starts")
        return None
    return rec.id


def deliver(bank: BankStore) -> list[str]:
    """Add the records pending for ``bank``; the ids delivered. One that fails stays
    pending with every one after it."""
    entries = _read()
    mine = [e for e in entries if e["bank"] == bank.location]
    if not mine:
        return []
    delivered: list[str] = []
    try:
        for entry in mine:
            rec = record_from_json(entry["record"])
            bank.add(rec)
            delivered.append(rec.id)
    finally:
        done = {id(e) for e in mine[:len(delivered)]}
        _write([e for e in entries if id(e) not in done])
    return delivered
