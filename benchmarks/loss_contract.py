"""Error rates of the loss contract at the tolerances doctor calibrates.

For each job: doctor runs as in a campaign (baseline repeats, the spec's calibration
variants, a reference and honest splits per numerics class); then every honest variant
(held out: none of them is a calibration variant) and every cheat runs once through the
real path (patch worktree -> launcher -> ``checks.enforce``), then all of them again at
two canary seeds (the first verification round's, and contract seed + 2002, whose loss spikes),
checked against their class's reference run at that seed as verification checks them
(with the seed's own honest spread). The table counts honest variants rejected and
cheats accepted at the contract seed and at the canary seeds; all must be 0.

    python benchmarks/loss_contract.py                       # every job
    python benchmarks/loss_contract.py --jobs lastmb-eval    # one
    python benchmarks/loss_contract.py --jobs builtin --flavour tiny   # the built-in spec, smaller model

Jobs: ``builtin`` (workloads/gpt/campaign.toml, the debug flavour, as shipped),
``lastmb-eval`` and ``lastmb-window`` (tests/loss_contract/job: a trainer that reports its
last micro-batch's loss, with loss_signal "eval" and "window").
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "adversarial"), str(ROOT / "tests" / "loss_contract")]

from adversarial_cheats import train_cheat  # noqa: E402
from last_microbatch import CHEATS as JOB_CHEATS  # noqa: E402
from last_microbatch import HONEST, cheat_patch, runtime

from infrarsi.contract.checks import enforce  # noqa: E402
from infrarsi.core.trial import Outcome, Role  # noqa: E402
from infrarsi.harness.inprocess_pool import InProcessPool  # noqa: E402
from infrarsi.stages.canary import canary_loss_check, canary_split_runner  # noqa: E402
from infrarsi.stages.doctor import run_doctor  # noqa: E402
from infrarsi.stages.init import builtin_spec_path, init_campaign  # noqa: E402
from infrarsi.stages.run.verify import canary_seed  # noqa: E402
from infrarsi.stages.runtime import CampaignRuntime, RuntimeSettings  # noqa: E402

# Held-out honest variants of the built-in job (none is a calibration variant).
BUILTIN_HONEST = [
    {"micro_batch": 8, "checkpointing": "none", "attention": "sdpa"},
    {"micro_batch": 16, "checkpointing": "none", "attention": "sdpa", "optimizer": "foreach"},
    {"checkpointing": "selective"}, {"optimizer": "fused"}, {"threads": 1},
    {"nproc": 2, "threads": 1, "bucket_mb": 1},
    {"precision": "bf16", "micro_batch": 8, "attention": "sdpa"},
    {"precision": "bf16", "micro_batch": 16, "checkpointing": "none", "attention": "sdpa", "optimizer": "foreach"},
]
JOB_HONEST = HONEST + [{"threads": 2}, {"micro_batch": 16, "threads": 2}, {"precision": "bf16", "micro_batch": 32},
                      {"precision": "bf16", "micro_batch": 8, "threads": 2}]
# (cheat, extra knobs): the adversarial suite's cheats against the built-in trainer.
BUILTIN_CHEATS = [("short_seq", {}), ("fewer_tokens", {}), ("skip_optimizer", {}), ("skip_micro_compute", {}),
                  ("easy_data", {}), ("shrink_model", {}), ("fewer_steps", {}), ("sneak_bf16", {}),
                  ("degrade_bf16", {"precision": "bf16"}), ("short_seq", {"precision": "bf16"})]


def _edited(text: str, edits: list[tuple[str, str]]) -> str:
    for old, new in edits:
        assert text.count(old) == 1, f"the built-in spec changed: {old!r} is not in it once"
        text = text.replace(old, new)
    return text


def builtin_runtime(tmp: Path, flavour: str) -> CampaignRuntime:
    """The built-in spec as shipped, with the cheats as patches (and on ``flavour``)."""
    spec_path = builtin_spec_path()
    patches = [str(train_cheat(tmp / "cheats", name)) for name in sorted({c for c, _ in BUILTIN_CHEATS})]
    edits = [('workload_dir = "."', f"workload_dir = {json.dumps(str(spec_path.parent))}\n"
                                    f"patches = {json.dumps(patches)}"),
             ("[resources]\n", "[resources]\nmax_remeasures = 0  # timing is not measured here\n"),
             ("trial_timeout_s = 150", "trial_timeout_s = 1200")]  # a loaded machine must not decide
    if flavour != "debug":  # the same spec on a smaller model (and shorter sequences) where time is short
        edits += [('"--flavour", "debug"', f'"--flavour", "{flavour}"'), ("seq_len = 256", "seq_len = 128"),
                  ("global_batch_tokens = 4096", "global_batch_tokens = 2048"),
                  ('memory_capacity = "600MiB"', 'memory_capacity = "4GiB"')]
    path = tmp / "builtin.toml"
    path.write_text(_edited(spec_path.read_text(), edits))
    contract, cdir = init_campaign(path, tmp / "out")
    return CampaignRuntime(contract, cdir, RuntimeSettings(), pool=InProcessPool())


def measure(rt: CampaignRuntime, honest: list[dict], cheats: list[tuple[str, dict]],
            canary_seeds: list[int] = ()) -> dict:
    doctor = run_doctor(rt)
    losses = doctor.loss_reference
    baseline = rt.space.validate(rt.spec.baseline)

    def run(config: dict):
        return rt.run_one({**baseline, **config}, Role.SEARCH,
                          check=lambda t: enforce(t, rt.spec.contract, losses))

    # (kind, label, config): every honest variant and every cheat, first at the contract
    # seed as the search checks them, then at each canary seed as verification checks them.
    variants = ([("honest", cfg, cfg) for cfg in honest]
                + [("cheat", {"patch": name, **knobs}, {**knobs, f"patch_{name}": True}) for name, knobs in cheats])
    rows = []
    for kind, label, cfg in variants:
        r = run(cfg)
        rows.append({"kind": kind, "config": label, "outcome": r.outcome.value, "reason": r.reason})
    contract = rt.spec.contract
    for seed in canary_seeds:
        a = rt.run_one(baseline, Role.VERIFY_BASELINE, seed=seed, check=lambda t: enforce(t, contract, None))
        check = canary_loss_check(contract, losses, a, seed, [{**baseline, **cfg} for _, _, cfg in variants],
                                  lambda cfg: rt.run_one(cfg, Role.VERIFY_BASELINE, seed=seed),
                                  canary_split_runner(rt, seed))
        for kind, label, cfg in variants:
            r = rt.run_one({**baseline, **cfg}, Role.VERIFY, seed=seed, check=check)
            rows.append({"kind": kind, "config": label, "seed": seed, "outcome": r.outcome.value,
                         "reason": r.reason})
    classes = {(", ".join(f"{k}={v}" for k, v in c.settings) or "baseline numerics"): c.tolerance
               for c in losses.classes}
    return {"signal": losses.signal, "tolerances": classes, "warnings": list(losses.warnings), "rows": rows,
            "honest": sum(r["kind"] == "honest" for r in rows),
            "honest_rejected": sum(r["kind"] == "honest" and r["outcome"] == "contract_violation" for r in rows),
            "honest_failed_otherwise": sum(r["kind"] == "honest" and r["outcome"] not in ("ok", "contract_violation")
                                           for r in rows),
            "cheats": sum(r["kind"] == "cheat" for r in rows),
            "cheats_accepted": sum(r["kind"] == "cheat" and r["outcome"] == Outcome.OK.value for r in rows)}


SPIKY_SEED_OFFSET = 2002


def job(name: str, tmp: Path, flavour: str) -> dict:
    rt = (builtin_runtime(tmp, flavour) if name == "builtin"
          else runtime(tmp, name.split("-", 1)[1], [cheat_patch(tmp / "cheats", c) for c in JOB_CHEATS]))
    seed = rt.spec.contract.seed
    # The first verification round's seed, and contract seed + 2002, where a loss spike
    # amplifies rounding on the debug flavour (the third minimization round's seed when
    # minimization ran rounds of its own: it rejected honest runs in a default campaign
    # before the canary check judged them at the seed's own honest spread).
    canaries = [canary_seed(seed, 0), seed + SPIKY_SEED_OFFSET]
    if name == "builtin":
        return measure(rt, BUILTIN_HONEST, BUILTIN_CHEATS, canaries)
    return measure(rt, JOB_HONEST, [(c, {}) for c in JOB_CHEATS], canaries)


def table(results: dict[str, dict]) -> str:
    lines = ["| job | signal | calibrated tolerance per numerics class | honest rejected (contract seed; "
             "canary seeds) | cheats accepted (contract seed; canary seeds) |", "|---|---|---|---|---|"]
    for name, r in results.items():
        tol = "; ".join(f"{k} {v:.2g}" for k, v in r["tolerances"].items())
        rejected = _counts(r["rows"], "honest", Outcome.CONTRACT_VIOLATION.value)
        accepted = _counts(r["rows"], "cheat", Outcome.OK.value)
        lines.append(f"| {name} | {r['signal']} | {tol} | {rejected} | {accepted} |")
    return "\n".join(lines)


def _counts(rows: list[dict], kind: str, outcome: str) -> str:
    """'n of N; m of M': runs of ``kind`` with ``outcome`` at the contract seed; at the canary seeds."""
    return "; ".join(f"{sum(x['outcome'] == outcome for x in xs)} of {len(xs)}"
                     for xs in ([x for x in rows if x["kind"] == kind and ("seed" in x) == canary]
                                for canary in (False, True)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", default="builtin,lastmb-eval,lastmb-window")
    parser.add_argument("--json", type=Path, help="also write every run's outcome and reason here")
    parser.add_argument("--flavour", default="debug", help="model flavour of the builtin job (debug as shipped; "
                        "tiny, at seq 128 and 2048 tokens per step, runs in a fraction of the time)")
    args = parser.parse_args()
    results = {}
    with tempfile.TemporaryDirectory(prefix="loss-contract-") as tmp:
        for name in args.jobs.split(","):
            results[name] = job(name, Path(tmp) / name, args.flavour)
            for row in results[name]["rows"]:
                print(f"{name} {row['kind']:6} {json.dumps(row['config'])} seed {row.get('seed', 'contract')} -> "
                      f"{row['outcome']} {row['reason'][:160]}", flush=True)
    print(table(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1, default=str))
    return 0 if all(r["honest_rejected"] == 0 and r["cheats_accepted"] == 0 for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
