"""The ``infrarsi`` command: ``campaign`` runs the Prefect flow, ``report`` rebuilds a report,
``compare`` puts the campaigns of an MLflow store side by side, ``bank`` lists, shows or
forgets the experience bank's campaigns.

A bad input (a folder that is not a campaign, an address nothing answers at, a spec that
does not validate) ends in one ``infrarsi: error:`` paragraph saying what to do, and exit
status 2, never a traceback. Warnings a campaign raises (an unreachable MLflow or LLM, a
budget cut by the cap, contaminated timings) are printed on stderr as they happen, from
the first probe on (``cli.console``). With ``--json`` (``campaign``, ``report``,
``compare``, ``bank``) stdout carries exactly one JSON document and every line meant for
people goes to stderr."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import typing
from pathlib import Path

from infrarsi.cli import bank as bank_cli
from infrarsi.cli.console import (JSON_HELP, CampaignConsole, Stopped, native_stderr_to, stdout_to_stderr,
                                  stop_on_signal)
from infrarsi.core.errors import InfrarsiError
from infrarsi.core.options import CampaignOptions


def _add_options(parser: argparse.ArgumentParser) -> None:
    """One flag per field of CampaignOptions (``spec`` is the positional argument), with
    the field's description as its help: the CLI and the flow take the same options."""
    for name, field in CampaignOptions.model_fields.items():
        help_text = field.description
        if name == "spec":
            parser.add_argument("spec", nargs="?", help=help_text)
            continue
        flag = "--" + name.replace("_", "-")
        annotation = typing.get_args(field.annotation) or (field.annotation,)
        kinds = [a for a in annotation if a is not type(None)]
        if kinds == [bool]:
            parser.add_argument(flag, action="store_true", help=help_text)
        elif typing.get_origin(kinds[0]) is typing.Literal:
            parser.add_argument(flag, choices=typing.get_args(kinds[0]), help=help_text)
        else:
            parser.add_argument(flag, type=kinds[0], metavar=name.upper(), help=help_text)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="infrarsi", description="Make a working training job faster "
                                "without changing what it trains.")
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("campaign", help="run a campaign: init -> doctor -> run -> report -> apply")
    _add_options(c)
    c.add_argument("--json", action="store_true", help=JSON_HELP.format("the campaign's summary"))
    c.add_argument("--no-progress", action="store_true",
                   help="no progress (a bar on a terminal, else one line per trial); warnings are still printed")
    c.add_argument("--no-bank", action="store_true", help="neither read nor write the experience bank (--bank off)")
    c.set_defaults(func=_campaign)
    i = sub.add_parser("init", help="write a starting spec from the command that launches your job",
                       usage="infrarsi init [-o SPEC] [--name NAME] [--no-dry-run] [--dry-run-timeout S] [--force] "
                             "-- python train.py --batch_size=12 ...")
    i.add_argument("-o", "--output", default="campaign.toml", help="spec to write (default: ./campaign.toml)")
    i.add_argument("--name", help="the spec's name, which names its campaigns and MLflow experiment "
                                  "(default: the script's name)")
    i.add_argument("--no-dry-run", action="store_true", help="do not run the job to guess its log lines")
    i.add_argument("--dry-run-timeout", type=float, default=120.0, metavar="S",
                   help="seconds the dry run may take before it is stopped (default: %(default)s)")
    i.add_argument("--force", action="store_true", help="overwrite an existing spec")
    i.add_argument("job", nargs=argparse.REMAINDER, help="the launch command, after --")
    i.set_defaults(func=_init)
    r = sub.add_parser("report", help="rebuild the report of a campaign folder")
    r.add_argument("dir", help="the campaign folder (<data>/campaigns/<campaign-id>, or under --out)")
    r.add_argument("--json", action="store_true", help=JSON_HELP.format("the campaign's summary"))
    r.set_defaults(func=_report)
    bank_cli.add_parser(sub)
    m = sub.add_parser("compare", help="compare the campaigns of an MLflow store: one table, one plot")
    m.add_argument("--tracking-uri", help="MLflow store (default: $MLFLOW_TRACKING_URI, else the machine's "
                                          "shared store in the infrarsi data folder)")
    m.add_argument("--job", help="only campaigns of this job (spec name)")
    m.add_argument("--hardware", help="only campaigns whose hardware hash or description contains this")
    m.add_argument("--plot", default="compare.png", help="where the best-so-far plot goes (default: %(default)s)")
    m.add_argument("--json", action="store_true", help=JSON_HELP.format("the rows and the plot's path"))
    m.set_defaults(func=_compare)
    return p


def _prepared(options: CampaignOptions) -> tuple[CampaignOptions, int, int]:
    """``options`` with the id of a new campaign from a local spec (so its log has a folder
    from the start), the most trials it can run and the trials already recorded (for the
    bar). The spec is loaded here once, to fail fast before Prefect or Ray start."""
    from infrarsi.contract.spec_load import load_spec
    from infrarsi.core.ledger import Ledger
    from infrarsi.stages.budget import campaign_cap
    from infrarsi.stages.init import builtin_spec_path, git_spec, load_campaign, new_campaign_id

    if options.resume:
        contract, cdir = load_campaign(Path(options.resume))
        done = len({t.trial_id for t in Ledger(cdir.ledger).trials()})
        return options, campaign_cap(contract.spec, options.resumed(cdir)), done
    if options.spec and git_spec(options.spec):
        return options, 0, 0  # cloned by init: not known yet
    spec = load_spec(options.spec or builtin_spec_path())
    if not options.campaign_id:
        options = options.model_copy(update={"campaign_id": new_campaign_id(spec)})
    return options, campaign_cap(spec, options), 0


def _campaign_folder(options: CampaignOptions) -> Path | None:
    """The campaign's folder, where it is known before init (not for a spec cloned from git)."""
    from infrarsi.core.workspace import default_campaigns_dir

    if options.resume:
        return Path(options.resume)
    if options.campaign_id:
        return (Path(options.out) if options.out else default_campaigns_dir()) / options.campaign_id
    return None


def _log_path(options: CampaignOptions) -> Path:
    """The campaign folder's prefect.log (the out folder's, for a spec cloned from git)."""
    from infrarsi.core.workspace import default_campaigns_dir

    folder = _campaign_folder(options)
    return (folder or (Path(options.out) if options.out else default_campaigns_dir())) / "prefect.log"


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
    """Run the campaign, print its summary; return the summary (the ``--json`` document)."""
    summary = _run_campaign(args)
    _print_summary(summary, warnings_shown=True)  # each printed as it was raised
    return summary


def _run_campaign(args: argparse.Namespace) -> dict:
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    options = CampaignOptions.parse({**{k: getattr(args, k) for k in CampaignOptions.model_fields},
                                     **({"bank": "off"} if args.no_bank else {})})
    console = CampaignConsole()
    # Listening before any outside system is touched: the probes' warnings (an MLflow or LLM
    # that does not answer) are printed when raised, not when the campaign ends.
    with console.warnings():
        options, total, done = _prepared(options)
        from flows.campaign import campaign
        from infrarsi.harness.process_guard import guard_campaign

        log_path = _log_path(options)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        # Before the flow starts Prefect's temporary server: every process started from here on
        # ends with this one.
        for line in guard_campaign(_campaign_folder(options)):
            console.line(f"infrarsi: {line}")
        try:
            with _console_logs_to(log_path), native_stderr_to(log_path) as stream, stop_on_signal():
                console.stream = stream
                if args.no_progress:
                    return campaign(options)
                with console.progress(total, done):
                    return campaign(options)
        except InfrarsiError as exc:
            exc.add_note(f"(the stage's traceback is in {log_path})")
            raise
        except Stopped as exc:
            folder = _campaign_folder(options) or log_path.parent
            exc.add_note(f"what it recorded is kept; finish it with `infrarsi campaign --resume {folder}` "
                         f"(its log: {log_path})")
            raise
        finally:
            console.stream = sys.stderr


def _init(args: argparse.Namespace) -> None:
    from infrarsi.discover.init import init_spec

    job = args.job[1:] if args.job[:1] == ["--"] else args.job
    path = init_spec(job, cwd=Path.cwd(), out_path=Path(args.output), name=args.name, force=args.force,
                     run_job=not args.no_dry_run, dry_run_timeout_s=args.dry_run_timeout)
    print(f"wrote {path}: check the lines marked CONFIRM, then run: infrarsi campaign {args.output}")
    return None


def _contribution(c: dict) -> str:
    """A change's contribution as the console says it: measured or predicted, and its ground."""
    share = ("no figure" if c["contribution"] is None
             else f"{c.get('source', 'measured')} {c['contribution']:.2f}x"
             + (f" (90% CI {c['ci'][0]:.2f}-{c['ci'][1]:.2f})" if c.get("ci") else ""))
    return share + (f"; {c['ground']}" if c.get("ground") else "")


def _print_summary(summary: dict, *, warnings_shown: bool = False) -> None:
    """A campaign's summary as lines for people (on stderr under ``--json``)."""
    if summary.get("verified_speedup"):
        lo, hi = summary["speedup_ci"]
        what = "end to end" if summary.get("end_to_end_speedup") is not None else "per step"
        where = f" in {summary['repository']}" if summary.get("repository") else ""
        print(f"verified speedup {summary['verified_speedup']:.2f}x {what} (90% CI {lo:.2f}-{hi:.2f}); "
              f"branch {summary['branch']}{where}")
        if summary.get("end_to_end_speedup") is not None:
            print(f"per step {summary['step_speedup']:.2f}x; job of {summary['job_steps']:,.0f} steps")
        for c in summary.get("promoted_changes") or []:
            print(f"  {c['knob']}: {c['from']} -> {c['to']}, {_contribution(c)}")
        for c in summary.get("dropped_changes") or []:
            print(f"  dropped {c['knob']}: {c['from']} -> {c['to']}, {_contribution(c)}")
    else:
        print("no candidate passed verification; the baseline stands")
    if summary.get("canary_effective") is False:
        print(summary["canary_note"])
    if summary.get("noise_estimate_weak"):
        print("warning: doctor's noise estimate is weak (too few baseline runs)")
    if summary.get("campaign_wall_s") is not None:
        print(f"campaign wall time {summary['campaign_wall_s']:.0f} s")
    print(f"trials by outcome {summary['trials_by_outcome']}; failed-trial seconds {summary['failed_trial_seconds']}")
    warnings = summary.get("warnings") or []
    if warnings and warnings_shown:
        print(f"{len(warnings)} warning(s), printed above and listed in the report")
    for warning in warnings if not warnings_shown else ():
        print(f"warning: {warning}")
    print(f"report: {summary['report']}")


def _compare(args: argparse.Namespace) -> dict:
    """Print the table and the plot's path; return both as the ``--json`` document."""
    from infrarsi.cli.compare import compare, format_table
    from infrarsi.core.workspace import default_tracking_uri

    rows, plot = compare(args.tracking_uri or default_tracking_uri(), job=args.job, hardware=args.hardware,
                         plot_path=Path(args.plot))
    print(format_table(rows))
    print(f"plot: {plot}" if plot else "plot: none (no campaign has an ok search trial)")
    return {"campaigns": rows, "plot": str(plot) if plot else None}


def _report(args: argparse.Namespace) -> dict:
    """Rebuild the report, print the summary; return it (the ``--json`` document)."""
    from infrarsi.core.workspace import CampaignDir
    from infrarsi.record.campaign import read_summary
    from infrarsi.stages.report.report import build_report

    root = Path(args.dir).resolve()
    if not (root / "contract.json").is_file():
        what = "does not exist" if not root.exists() else "is not a campaign folder (it holds no contract.json)"
        raise InfrarsiError(f"{root} {what}: pass the folder a campaign ran in, <data>/campaigns/<campaign-id> "
                            "(or under the --out folder it was given): the folder of the report path it printed")
    build_report(root)
    summary = read_summary(CampaignDir(root))
    _print_summary(summary)
    return summary


def main(argv: list[str] | None = None) -> int:
    """Run one command: each prints its lines for people and returns its ``--json`` document."""
    args = _parser().parse_args(argv)
    try:
        if not getattr(args, "json", False):
            args.func(args)
            return 0
        with stdout_to_stderr():
            document = args.func(args)
        print(json.dumps(document, sort_keys=True, default=str), flush=True)
        return 0
    except InfrarsiError as exc:
        print(" ".join([f"infrarsi: error: {exc}", *getattr(exc, "__notes__", [])]), file=sys.stderr)
        return 2
    except OSError as exc:  # a folder or file given that cannot be read or written
        print(f"infrarsi: error: {exc}", file=sys.stderr)
        return 2
    except Stopped as exc:  # SIGTERM or SIGHUP: one line, and the shell's exit status for the signal
        print(" ".join([f"infrarsi: stopped by {exc}.", *getattr(exc, "__notes__", [])]), file=sys.stderr)
        return 128 + exc.signum

