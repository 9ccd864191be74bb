"""The campaign flow: init -> doctor -> run (search, verify) -> report -> apply."""

from __future__ import annotations

from typing import Any

from prefect import flow

from infrarsi.core import progress
from infrarsi.core.options import CampaignOptions
from infrarsi.harness.process_guard import guard_campaign
from infrarsi.record.campaign import read_summary
from infrarsi.stages.budget import campaign_cap
from infrarsi.stages.report.summary import campaign_metrics
from infrarsi.stages.run import patching
from infrarsi.stages.runtime import CampaignRuntime, RuntimeSettings
from tasks.publish import name_flow_run, publish_task
from tasks.stages import (
    adopt_doctor_task,
    apply_task,
    bank_task,
    doctor_task,
    experience_task,
    init_task,
    minimize_task,
    report_task,
    search_task,
    verify_task,
)


@flow(name="infrarsi-campaign", log_prints=True)
def campaign(options: CampaignOptions = CampaignOptions()) -> dict[str, Any]:
    """Tune one training job: a new campaign from ``options.spec`` (a path or a git URL;
    default: the built-in GPT workload), or the one in ``options.resume``."""
    contract, cdir, opts = init_task(options)
    name_flow_run(contract.campaign_id)
    for line in guard_campaign(cdir.root):  # what this campaign starts ends with its process
        print(line)
    max_trials = campaign_cap(contract.spec, opts)
    rt = CampaignRuntime(contract, cdir, RuntimeSettings(
        ray_address=opts.ray_address, tracking_uri=opts.tracking_uri, concurrency=opts.concurrency, bank=opts.bank,
        max_trials=max_trials, parent_params={
            # the search logs num_trials, the search trials it runs, once it knows them
            "proposer": opts.proposer, "budget": opts.budget, "max_trials": max_trials,
            "concurrency": opts.concurrency or "auto"},
        on_result=progress.publish))
    try:
        patching.restore(rt)  # a resumed campaign's patch knobs, before any stage runs
        doctor = doctor_task.with_options(refresh_cache=opts.fresh_doctor or None)(rt)
        adopt_doctor_task(rt, doctor)
        search = search_task(rt, doctor, opts.proposer, opts.budget, experience_task(rt))
        verification = minimize_task(rt, doctor, verify_task(rt, doctor, search))
        try:
            apply_task(rt, doctor, verification)
            bank_task(rt)
        finally:  # built once: it names the branch and any warning the bank raised, or stands without them
            report_task(cdir)
        summary = read_summary(cdir)
        publish_task(cdir, summary)
        rt.finish(campaign_metrics(summary), tags={"infrarsi.branch": summary["branch"] or ""})
    except BaseException as exc:  # the MLflow parent run never stays RUNNING
        rt.fail("FAILED" if isinstance(exc, Exception) else "KILLED")
        raise
    finally:
        rt.close()
    return summary
