"""The campaign flow: init -> doctor -> run (search, verify) -> report -> apply."""

from __future__ import annotations

from typing import Any

from prefect import flow

from infrarsi.report import summarize
from infrarsi.runtime import CampaignRuntime, RuntimeSettings
from tasks.stages import (adopt_doctor_task, apply_task, bank_task, doctor_task, init_task, report_task, search_task,
                          verify_task)


@flow(name="infrarsi-campaign", log_prints=True)
def campaign(spec: str | None = None, out: str = "campaigns", budget: int | None = None,
             proposer: str | None = None, campaign_id: str | None = None, resume: str | None = None,
             ray_address: str | None = None, tracking_uri: str | None = None,
             concurrency: int | None = None, fresh_doctor: bool = False, bank: str | None = None) -> dict[str, Any]:
    """Tune one training job. ``spec``: a campaign TOML (default: the built-in GPT workload);
    ``resume``: a campaign folder to finish instead of starting a new one."""
    contract, cdir = init_task(spec, out, campaign_id, resume)
    rt = CampaignRuntime(contract, cdir, RuntimeSettings(ray_address=ray_address, tracking_uri=tracking_uri,
                                                         concurrency=concurrency, bank=bank))
    try:
        doctor = doctor_task.with_options(refresh_cache=fresh_doctor or None)(rt)
        adopt_doctor_task(rt, doctor)
        search = search_task(rt, doctor, proposer or rt.spec.search.proposer, budget or rt.spec.budget.num_trials)
        verification = verify_task(rt, doctor, search)
        report_task(cdir)
        apply_task(rt, doctor, verification)
        report_task(cdir)  # again, so the report names the branch
        bank_task(rt)
        rt.finish(summarize(cdir))
    finally:
        rt.close()
    return summarize(cdir)
