"""The ``infrarsi`` command: ``campaign`` runs the Prefect flow, ``report`` rebuilds a report."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import threading
from pathlib import Path

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
    i = sub.add_parser("init", help="write a starting spec from the command that launches your job",
                       usage="infrarsi init [-o SPEC] [--no-dry-run] -- python train.py --batch_size=12 ...")
    i.add_argument("-o", "--output", default="campaign.toml", help="spec to write (default: ./campaign.toml)")
    i.add_argument("--name", help="campaign name (default: the script's name)")
    i.add_argument("--no-dry-run", action="store_true", help="do not run the job to guess its log lines")
    i.add_argument("--dry-run-timeout", type=float, default=120.0, help="seconds the dry run may take")
    i.add_argument("--force", action="store_true", help="overwrite an existing spec")
    i.add_argument("job", nargs=argparse.REMAINDER, help="the launch command, after --")
    r = sub.add_parser("report", help="rebuild the report of a campaign folder")
    r.add_argument("dir")
    r.add_argument("--json", action="store_true")
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


@contextlib.contextmanager
def _console_logs_to(path: Path):
    """While the flow runs, what Prefect would print on the console (run logs, a failed
    stage's traceback) goes to ``path``; the CLI prints the error's message itself."""
    import logging

    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    consoles = [h for h in logging.root.handlers if isinstance(h, logging.StreamHandler)
                and not isinstance(h, logging.FileHandler)]
    for h in consoles:
        logging.root.removeHandler(h)
    logging.root.addHandler(handler)
    try:
        yield
    finally:
        logging.root.removeHandler(handler)
        handler.close()
        for h in consoles:
            logging.root.addHandler(h)


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
    log_path = root / "prefect.log"
    try:
        with _console_logs_to(log_path):
            return campaign(spec=args.spec, out=args.out, budget=args.budget, proposer=args.proposer,
                            campaign_id=campaign_id, resume=args.resume, ray_address=args.ray_address,
                            tracking_uri=args.tracking_uri, concurrency=args.concurrency,
                            fresh_doctor=args.fresh_doctor)
    except InfrarsiError as exc:
        exc.add_note(f"(the stage's traceback is in {log_path})")
        raise
    finally:
        stop.set()
        if bar:
            bar.join()


def _init(args: argparse.Namespace) -> int:
    from infrarsi.init_spec import init_spec

    job = args.job[1:] if args.job[:1] == ["--"] else args.job
    path = init_spec(job, cwd=Path.cwd(), out_path=Path(args.output), name=args.name, force=args.force,
                     run_job=not args.no_dry_run, dry_run_timeout_s=args.dry_run_timeout)
    print(f"wrote {path}: check the lines marked CONFIRM, then run: infrarsi campaign {args.output}")
    return 0


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
        if args.command == "init":
            return _init(args)
        if args.command == "campaign":
            summary = _campaign(args)
        else:
            from infrarsi.report import build_report, summarize
            from infrarsi.workspace import CampaignDir

            build_report(args.dir)
            summary = summarize(CampaignDir(Path(args.dir).resolve()))
    except InfrarsiError as exc:
        print(" ".join([f"infrarsi: error: {exc}", *getattr(exc, "__notes__", [])]), file=sys.stderr)
        return 2
    _print_summary(summary, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
