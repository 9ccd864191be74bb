"""A small simulated campaign run stage by stage on real Ray without Prefect, the way the
flow wires the stages, for tests of what reads a finished campaign (report, compare)."""

from pathlib import Path

import pytest

from infrarsi.core.workspace import CampaignDir
from infrarsi.record.campaign import read_summary
from infrarsi.stages.apply import run_apply
from infrarsi.stages.doctor import run_doctor
from infrarsi.stages.init import init_campaign
from infrarsi.stages.report.report import build_report
from infrarsi.stages.report.summary import campaign_metrics
from infrarsi.stages.run.evidence import plan_verification
from infrarsi.stages.run.minimize import run_minimize
from infrarsi.stages.run.search import run_search
from infrarsi.stages.run.verify import run_verification
from infrarsi.stages.runtime import CampaignRuntime, RuntimeSettings


def run_staged(tmp: Path, *, name: str, proposer: str, store: str, num_trials: int = 6,
               sim_workload: str = "dense-9b-h100", resources: str = "", in_process: bool = False,
               finish: bool = False) -> CampaignDir:
    """``resources``: lines of the spec's [resources] table; ``in_process``: without Ray;
    ``finish``: minimization and apply too (a branch in the simulated job's repository),
    as the flow runs them."""
    tmp.mkdir(parents=True, exist_ok=True)
    spec = tmp / f"{name}.toml"
    spec.write_text(f'name = "{name}"\nbackend = "sim"\nsim_workload = "{sim_workload}"\n'
                    f'[budget]\nnum_trials = {num_trials}\nnum_finalists = 1\nverify_pairs = 2\n'
                    f'[search]\nproposer = "{proposer}"\n[resources]\n{resources}\n')
    contract, cdir = init_campaign(spec, tmp / "out")
    rt = CampaignRuntime(contract, cdir, RuntimeSettings(
        tracking_uri=store, in_process=in_process, parent_params={"proposer": proposer, "num_trials": num_trials}))
    try:
        doctor = run_doctor(rt)
        search = run_search(rt, doctor, proposer_name=proposer, num_trials=num_trials)
        verification = run_verification(rt, doctor, plan_verification(rt, doctor, search.history, search.priors))
        if finish:
            verification = run_minimize(rt, doctor, verification)
            run_apply(contract, cdir, doctor, verification, parent_run_id=rt.parent_run_id)
        build_report(cdir.root)
        summary = read_summary(cdir)
        rt.finish(campaign_metrics(summary), tags={"infrarsi.branch": summary["branch"] or ""})
    finally:
        rt.close()
    return cdir


@pytest.fixture(scope="session")
def staged_campaigns(tmp_path_factory, ray_session):
    """Two finished campaigns (minimized, a branch staged for what each promoted) of two jobs and two
    proposers in one MLflow store: (store, [dirs])."""
    tmp = tmp_path_factory.mktemp("staged")
    store = f"sqlite:///{tmp / 'mlflow.db'}"
    return store, [run_staged(tmp / "a", name="sim-dense", proposer="random", store=store, finish=True),
                   run_staged(tmp / "b", name="sim-moe", proposer="engine", store=store,
                              sim_workload="moe-26b-a4b-h200", finish=True)]
