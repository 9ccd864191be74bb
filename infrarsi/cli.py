"""The ``infrarsi`` command: ``campaign`` runs the Prefect flow, ``report`` rebuilds a report,
``bank`` lists, shows or forgets the experience bank's campaigns."""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
from pathlib import Path

from infrarsi import bank_cli
from infrarsi.errors import InfrarsiError


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="infrarsi", description="Make a working training job faster "
                                "without changing what it trains.")
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("campaign", help="run a campaign: init -> doctor -> run -> report -> apply")
    c.add_argument("spec", nargs="?", help="campaign TOML (default: the built-in GPT debug workload)")
    c.add_argument("--budget", type=int, help="search trials (default: the spec's budget.num_trials)")
    c.add_argument("--out", default="campaigns", help="folder that receives the campaign folder")
    c.add_argument("--proposer", help="search strategy (default: the spec's; e.g. engine, tpe, random)")
    c.add_argument("--resume", metavar="DIR", help="finish the campaign in DIR instead of starting one")
    c.add_argument("--ray-address", help="an existing Ray cluster (default: a local Ray)")
    c.add_argument("--tracking-uri", help="MLflow tracking URI (default: SQLite in the campaign folder)")
    c.add_argument("--concurrency", type=int, help="parallel trial slots (default: device slots)")
    c.add_argument("--fresh-doctor", action="store_true", help="re-measure the baseline even if cached")
    c.add_argument("--json", action="store_true", help="print a JSON summary as the last line")
    c.add_argument("--no-progress", action="store_true", help="no progress bar")
    c.add_argument("--bank", help="experience bank path (default: INFRARSI_BANK or the user's data folder)")
    c.add_argument("--no-bank", action="store_true", help="neither read nor write the experience bank")
    r = sub.add_parser("report", help="rebuild the report of a campaign folder")
    r.add_argument("dir")
    r.add_argument("--json", action="store_true")
    bank_cli.add_parser(sub)
    return p


def _progress(ledger: Path, total: int, stop: threading.Event) -> None:
    """A progress bar fed by the ledger, so it sees exactly what was recorded."""
    from tqdm import tqdm

    bar = tqdm(total=total, unit="trial", desc="trials", file=sys.stderr, dynamic_ncols=True)
    seen = 0
    while not stop.wait(0.5):
        if not ledger.exists():
            continue
        lines = [json.loads(ln) for ln in ledger.read_text().splitlines() if ln.strip().endswith("}")]
        trials = [e for e in lines if e.get("kind") == "trial"]
        if len(trials) > seen:
            last = trials[-1]
            bar.total = max(bar.total, len(trials))
            bar.update(len(trials) - seen)
            bar.set_postfix_str(f"{last['role']} {last['outcome']}")
            seen = len(trials)
    bar.close()


def _campaign(args: argparse.Namespace) -> dict:
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    from flows.campaign import campaign
    from infrarsi.spec import load_spec
    from infrarsi.stages.init import builtin_spec_path, new_campaign_id

    campaign_id, root = None, Path(args.resume) if args.resume else None
    if not args.resume:
        spec = load_spec(args.spec or builtin_spec_path())  # fail fast, before Prefect or Ray start
        campaign_id = new_campaign_id(spec)
        root = Path(args.out) / campaign_id
        total = (args.budget or spec.budget.num_trials) + spec.budget.doctor_repeats + len(spec.calibration) \
            + 2 * spec.budget.num_finalists * spec.budget.verify_pairs
    else:
        total = 0
    stop = threading.Event()
    bar = None
    if not args.no_progress:
        bar = threading.Thread(target=_progress, args=(root / "ledger.jsonl", total, stop), daemon=True)
        bar.start()
    try:
        return campaign(spec=args.spec, out=args.out, budget=args.budget, proposer=args.proposer,
                        campaign_id=campaign_id, resume=args.resume, ray_address=args.ray_address,
                        tracking_uri=args.tracking_uri, concurrency=args.concurrency, fresh_doctor=args.fresh_doctor,
                        bank="off" if args.no_bank else args.bank)
    finally:
        stop.set()
        if bar:
            bar.join()


def _print_summary(summary: dict, as_json: bool) -> None:
    if summary.get("verified_speedup"):
        lo, hi = summary["speedup_ci"]
        print(f"verified speedup {summary['verified_speedup']:.2f}x (90% CI {lo:.2f}-{hi:.2f}); "
              f"branch {summary['branch']}")
    else:
        print("no candidate passed verification; the baseline stands")
    print(f"trials by outcome {summary['trials_by_outcome']}; failed-trial seconds {summary['failed_trial_seconds']}")
    print(f"report: {summary['report']}")
    if as_json:
        print(json.dumps(summary, sort_keys=True))


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "bank":
            return bank_cli.run(args)
        if args.command == "campaign":
            summary = _campaign(args)
        else:
            from infrarsi.report import build_report, summarize
            from infrarsi.workspace import CampaignDir

            build_report(args.dir)
            summary = summarize(CampaignDir(Path(args.dir).resolve()))
    except InfrarsiError as exc:
        print(f"infrarsi: error: {exc}", file=sys.stderr)
        return 2
    _print_summary(summary, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
