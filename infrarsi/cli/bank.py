"""``infrarsi bank list|show|forget``: look into and prune the experience bank. Each prints its
lines for people and returns its ``--json`` document (``infrarsi.cli.main`` prints it)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from infrarsi.cli.console import JSON_HELP
from infrarsi.core.errors import InfrarsiError


def add_parser(sub: Any) -> None:
    b = sub.add_parser("bank", help="the experience bank: list, show or forget past campaigns")
    b.add_argument("--path", help="bank: a SQLite file or mlflow+<tracking URI> (default: INFRARSI_BANK, "
                   "else bank.sqlite in the user's data folder)")
    b.add_argument("--json", action="store_true", help=JSON_HELP.format("the result"))
    bsub = b.add_subparsers(dest="bank_command", required=True)
    listing = bsub.add_parser("list", help="one line per recorded campaign")
    show = bsub.add_parser("show", help="one campaign: features, best config, patches, trials")
    show.add_argument("campaign_id")
    for p in (listing, show):  # after the subcommand too (bank list --json); SUPPRESS keeps one given before it
        p.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                       help=JSON_HELP.format("the rows" if p is listing else "the campaign"))
    forget = bsub.add_parser("forget", help="remove a campaign from the bank")
    forget.add_argument("campaign_id")
    b.set_defaults(func=run)


def _features(d: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in d.items() if v is not None)


def run(args: argparse.Namespace) -> Any:
    """Run the bank subcommand; return its ``--json`` document."""
    from infrarsi.bank.store import open_bank

    bank = open_bank(args.path)
    if bank is None:
        raise InfrarsiError("the experience bank is off (INFRARSI_BANK=off); pass --path FILE or --path mlflow+URI")
    if args.bank_command == "list":
        rows = bank.list()
        for r in rows:
            best = r["best_step_time_s"]
            print(f"{r['id']}  {r['backend']}  {r['num_trials']} trials  best "
                  f"{best if best is None else f'{best:.4f} s'}  [{_features(r['hardware'])}] [{_features(r['workload'])}]")
        if not rows:
            print(f"{bank.location}: no campaigns recorded")
        return rows
    rec = bank.get(args.campaign_id)
    if rec is None:
        raise InfrarsiError(f"{bank.location}: no campaign {args.campaign_id!r}; `infrarsi bank list` shows the ids")
    if args.bank_command == "forget":
        bank.forget(rec.id)
        print(f"forgot {rec.id}")
        return {"forgot": rec.id}
    best = rec.best
    shown = {"id": rec.id, "name": rec.name, "backend": rec.backend, "proposer": rec.proposer,
             "hardware": dict(rec.hardware), "workload": dict(rec.workload), "baseline": rec.baseline,
             "baseline_step_time_s": rec.baseline_step_time_s,
             "best": {"config": best.config, "step_time_s": best.step_time_s} if best else None,
             "promoted": rec.promoted, "num_trials": len(rec.trials),
             "outcomes": {o: sum(t.outcome.value == o for t in rec.trials) for o in {t.outcome.value for t in rec.trials}},
             "patches": [{k: v for k, v in p.items() if k != "patch"} for p in rec.patches],
             "num_effects": len(rec.effects)}
    if not args.json:  # the record is its own human form; under --json it is the document
        print(json.dumps(shown, indent=2, sort_keys=True, default=str))
    return shown
