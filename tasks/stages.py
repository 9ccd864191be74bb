"""One Prefect task per campaign stage. Each is a few lines over ``infrarsi.stages``.

Retries are for infrastructure faults only, raised where they happen: a trial's Ray
actor lost again on the pool's own retry, or the connection to Ray lost
(``TrialInfrastructureError``, from ``adapters.ray_pool``). The stages that run trials
(doctor, search, verify) retry once; before the retry the runtime drops the broken pool
(``CampaignRuntime.drop_pool``), so the retry runs on fresh trial slots, and it resumes
from the ledger: every recorded trial is taken back, none is run again, and a trial that
was in flight when the fault struck (never recorded) runs again as a new trial. An OOM, a
crash or a contract violation is a trial *result* (data), never an exception, so nothing
here retries a bad config. A spec or contract error, or an outside system that does not
answer at start, is the user's to fix and is not retried either.

Caching, stage by stage:

- doctor: cached across campaigns (``_doctor_cache_key`` says what the key covers):
  the same locked workload measured on the same machine gives the same baseline.
- the verification plan: not a Prefect cache; it is written once to the campaign folder
  (``verify_plan.json``) and read back on a retry or a resume. It depends on this
  campaign's search history, which no other campaign shares, so a cross-campaign cache
  key would have to cover the whole ledger.
- init, experience, search, verify, minimize, report, apply, bank: not cached. Their results are the
  trials in the ledger (which is what a retry or a resume reads) or files rebuilt from
  it; a cached return value would skip the ledger and could hand back a stale result.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from typing import Any, Iterator

from prefect import task
from prefect.cache_policies import NO_CACHE

from infrarsi.bank.similarity import Experience
from infrarsi.contract.freeze import Contract
from infrarsi.core.errors import TrialInfrastructureError
from infrarsi.core.options import CampaignOptions
from infrarsi.core.workspace import CampaignDir
from infrarsi.record.doctor import FORMAT as DOCTOR_FORMAT
from infrarsi.record.doctor import DoctorReport
from infrarsi.record.verification import VerificationReport
from infrarsi.stages.apply import run_apply
from infrarsi.stages.doctor import adopt_doctor, cached_doctor_trials, run_doctor
from infrarsi.stages.init import start_campaign
from infrarsi.stages.report.report import build_report
from infrarsi.stages.run.evidence import plan_verification
from infrarsi.stages.run.minimize import run_minimize
from infrarsi.stages.run.search import SearchOutcome, run_search
from infrarsi.stages.run.verify import run_verification
from infrarsi.stages.runtime import CampaignRuntime

INFRA_FAULTS = (TrialInfrastructureError,)


def retry_on_infrastructure_fault(task: Any, task_run: Any, state: Any) -> bool:
    try:
        state.result()
    except INFRA_FAULTS:
        return True
    except Exception:  # noqa: BLE001 - anything else is not a fault a retry can fix
        return False
    return False


@contextlib.contextmanager
def _fresh_pool_after_fault(rt: CampaignRuntime) -> Iterator[None]:
    """What a fault broke, the trial pool, is rebuilt before the task's retry."""
    try:
        yield
    except INFRA_FAULTS as exc:
        rt.ledger.append("infrastructure_fault", {"error": str(exc)})
        rt.cdir.add_warning("ray", f"{exc}; the stage is retried once on fresh trial slots, keeping every "
                                   "recorded trial")
        rt.drop_pool()
        raise


def _doctor_cache_key(context: Any, inputs: dict[str, Any]) -> str:
    """Doctor measures the workload on the machine, so its result is reused (from
    ``$PREFECT_HOME/storage``; ``--fresh-doctor`` measures again) only where all of these
    are the same: the contract (the spec's workload and every locked file's hash: what
    ``infrarsi init`` saw the job read), the machine, the source, the Python, torch and GPU
    driver versions, doctor's budget (repeats, timeout) and the trial seeds. Where the
    campaign runs does not enter the key; the report's format does (``infrarsi.record.doctor.FORMAT``)."""
    from infrarsi.harness.machine import software

    c: Contract = inputs["rt"].contract
    b, seed = c.spec.budget, c.spec.search.seed
    versions = hashlib.sha256(json.dumps(software(), sort_keys=True).encode()).hexdigest()[:12]
    return (f"infrarsi-doctor-{c.contract_hash}-{c.hardware_hash}-{c.source_hash}-{versions}"
            f"-r{b.doctor_repeats}-m{b.doctor_max_repeats}-t{b.trial_timeout_s:g}-s{seed}-f{DOCTOR_FORMAT}")


@task(name="init", cache_policy=NO_CACHE)
def init_task(options: CampaignOptions) -> tuple[Contract, CampaignDir, CampaignOptions]:
    return start_campaign(options)


@task(name="doctor", cache_key_fn=_doctor_cache_key, persist_result=True, retries=1,
      retry_condition_fn=retry_on_infrastructure_fault)
def doctor_task(rt: CampaignRuntime) -> DoctorReport:
    with _fresh_pool_after_fault(rt):
        return run_doctor(rt)


@task(name="adopt-doctor", cache_policy=NO_CACHE)
def adopt_doctor_task(rt: CampaignRuntime, report: DoctorReport) -> None:
    from_cache = not rt.cdir.doctor.exists()  # doctor ran here iff it wrote doctor.json
    adopt_doctor(rt, report)
    if from_cache:  # MLflow shows doctor's runs in every campaign that uses them
        for r in cached_doctor_trials(report, int(rt.spec.device.memory_capacity)):
            rt.tracker.log_trial(r, None, rt.contract.campaign_id)


@task(name="experience", cache_policy=NO_CACHE)
def experience_task(rt: CampaignRuntime) -> Experience | None:
    """What the experience bank's nearest past campaigns offer the search (None: bank off)."""
    from infrarsi.bank.campaign import campaign_experience

    return campaign_experience(rt.settings.bank, rt)


@task(name="search", cache_policy=NO_CACHE, retries=1, retry_condition_fn=retry_on_infrastructure_fault)
def search_task(rt: CampaignRuntime, doctor: DoctorReport, proposer: str, num_trials: int,
                experience: Experience | None) -> SearchOutcome:
    with _fresh_pool_after_fault(rt):
        return run_search(rt, doctor, proposer_name=proposer, num_trials=num_trials, experience=experience)


@task(name="verify", cache_policy=NO_CACHE, retries=1, retry_condition_fn=retry_on_infrastructure_fault)
def verify_task(rt: CampaignRuntime, doctor: DoctorReport, search: SearchOutcome) -> VerificationReport:
    with _fresh_pool_after_fault(rt):
        return run_verification(rt, doctor, plan_verification(rt, doctor, search.history, search.priors))


@task(name="minimize", cache_policy=NO_CACHE)
def minimize_task(rt: CampaignRuntime, doctor: DoctorReport, verification: VerificationReport) -> VerificationReport:
    return run_minimize(rt, doctor, verification)


@task(name="report", cache_policy=NO_CACHE)
def report_task(cdir: CampaignDir) -> str:
    return str(build_report(cdir.root))


@task(name="apply", cache_policy=NO_CACHE)
def apply_task(rt: CampaignRuntime, doctor: DoctorReport, verification: VerificationReport) -> dict[str, Any]:
    return run_apply(rt.contract, rt.cdir, doctor, verification, parent_run_id=rt.parent_run_id)


@task(name="bank", cache_policy=NO_CACHE)
def bank_task(rt: CampaignRuntime) -> str | None:
    """Record the finished campaign in the experience bank (unless it is off); a bank
    that cannot be written keeps the record pending for the next campaign and warns,
    so a finished campaign stays finished (``infrarsi.bank.pending``)."""
    from infrarsi.bank.pending import record_or_hold

    return record_or_hold(rt.settings.bank, rt.cdir)
