"""What the stages share while a campaign runs: folder, contract, trial pool (made by the
campaign's backend, ``infrarsi.backends``), ledger, tracker.

Every finished trial goes through ``record`` exactly once: the ledger first (the source of
truth, fsynced), then MLflow (which spools and catches up when it is unreachable), then
the progress callback. Every new trial is counted against the campaign's cap
(``infrarsi.stages.budget``) before it starts.

After an infrastructure fault (``TrialInfrastructureError``: an actor lost twice, the
connection to Ray lost) ``drop_pool`` throws the trial slots away, and with them the
trials that were in flight and never recorded; the stage's retry builds a fresh pool and
resumes from the ledger, so a recorded trial is neither lost nor run again.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from infrarsi.backends import Pool, backend_of
from infrarsi.contract.freeze import Contract
from infrarsi.core.knobs import Config
from infrarsi.core.ledger import Ledger
from infrarsi.core.trial import Outcome, Role, TrialResult
from infrarsi.core.workspace import CampaignDir
from infrarsi.harness.command import render_command
from infrarsi.harness.launcher import TrialRequest
from infrarsi.stages.budget import TrialBudgetExhausted, recorded_cap

log = logging.getLogger(__name__)


@dataclass(kw_only=True)
class RuntimeSettings:
    ray_address: str | None = None
    tracking_uri: str | None = None  # "none": no MLflow (the ledger stays the record)
    in_process: bool = False  # trials one at a time from this process, without Ray
    concurrency: int | None = None
    max_trials: int | None = None  # the campaign's trial cap; None: the folder's (stages.budget.recorded_cap)
    bank: str | None = None  # experience bank: a path, "mlflow+<URI>", "off", or None for INFRARSI_BANK / the default
    # Logged on the MLflow parent run over the spec's values: what this campaign actually used.
    parent_params: Mapping[str, Any] = field(default_factory=dict)
    on_result: Callable[[TrialResult], None] | None = field(default=None, repr=False)


class _NoTracking:
    """Stands in for the MLflow tracker where there is none (tracking_uri = "none")."""

    def start_campaign(self, *args: object, **kwargs: object) -> None:
        return None

    def log_trial(self, *args: object) -> None:
        pass

    def log_params(self, *args: object) -> None:
        pass

    def end_campaign(self, *args: object, **kwargs: object) -> None:
        pass


class CampaignRuntime:
    def __init__(self, contract: Contract, cdir: CampaignDir, settings: RuntimeSettings, *,
                 pool: Pool | None = None) -> None:
        """``pool``: trial slots to run on instead of the backend's own (a test's in-process
        pool); after ``drop_pool`` the backend makes the next one."""
        self.cdir, self.settings = cdir, settings
        self.adopt(contract)
        self.ledger = Ledger(cdir.ledger)
        if settings.tracking_uri == "none":
            self.tracker = _NoTracking()
        else:
            from infrarsi.adapters.tracking import Tracker

            self.tracker = Tracker(settings.tracking_uri or cdir.tracking_uri,
                                   experiment_name=f"infrarsi-{self.spec.name}", spool_path=cdir.mlflow_spool,
                                   on_warning=lambda message: cdir.add_warning("mlflow", message))
        self.parent_run_id = self.tracker.start_campaign(
            contract.campaign_id, params={"spec": self.spec.name, "backend": self.spec.backend,
                                          "proposer": self.spec.search.proposer,
                                          "contract_hash": contract.contract_hash, **settings.parent_params},
            tags={"infrarsi.hardware": contract.hardware_hash, "infrarsi.job": self.spec.name,
                  "infrarsi.hardware_desc": _hardware_desc(contract)})
        self.backend = backend_of(self.spec)
        self._pool = pool
        self._requests: dict[str, TrialRequest] = {}
        # Ids continue after every trial folder, recorded or not: a trial orphaned by a killed
        # campaign may still be writing into its folder when the campaign resumes.
        recorded = {t.trial_id for t in self.ledger.trials()}
        existing = [p.name for p in cdir.trials.glob("t[0-9]*")] + list(recorded)
        self._num_ids = max((int(n[1:]) for n in existing if n[1:].isdigit()), default=0)
        self.max_trials = settings.max_trials or recorded_cap(self.spec, cdir)
        self._counted = self._finished()  # trials finished or started here: what the cap counts

    def adopt(self, contract: Contract) -> None:
        """Run the campaign under ``contract`` from here on: the one place the runtime's
        contract changes (a patch round grows the space, ``stages.run.patching``); its spec
        and knob space always follow it."""
        self.contract, self.spec, self.space = contract, contract.spec, contract.spec.space

    def _finished(self) -> set[str]:
        """Trials with a final record (a trial whose attempts were all superseded, cut
        short by a fault, is no trial: it is run again as a new one)."""
        return {t.trial_id for t in self.ledger.trials() if not t.extra.get("retried")}

    @property
    def trials_left(self) -> int:
        """Trials the cap still allows (a trial's re-measurements are not new trials)."""
        return max(0, self.max_trials - len(self._counted))

    @property
    def pool(self) -> Pool:
        """The trial slots, made by the backend when first needed (and after ``drop_pool``)."""
        if self._pool is None:
            self._pool = self.backend.pool(self.spec, address=self.settings.ray_address,
                                           concurrency=self.settings.concurrency, in_process=self.settings.in_process)
        return self._pool

    def request(self, config: Config, role: Role, *, seed: int | None = None) -> TrialRequest:
        """The trial for ``config``; ``seed`` replaces the contract's seed in the command.
        Raises ``TrialBudgetExhausted`` when the cap allows no more trials."""
        if not self.trials_left:
            raise TrialBudgetExhausted(
                f"the campaign has run budget.max_trials = {self.max_trials} trials and may start no more "
                f"({role.value} asked for one); raise budget.max_trials to let it go further")
        self._num_ids += 1
        trial_id = f"t{self._num_ids:04d}"
        self._counted.add(trial_id)
        argv, env = render_command(self.spec, self.space, config, seed=seed)
        res, c = self.spec.resources, self.spec.contract
        self._requests[trial_id] = TrialRequest(
            trial_id=trial_id, config=dict(config), role=role, argv=argv, env=env, cwd=str(self.workdir_for(config)),
            trial_dir=str(self.cdir.trials / trial_id), memory_capacity_bytes=int(self.spec.device.memory_capacity),
            emulate_capacity=self.spec.device.emulate_capacity, timeout_s=self.spec.budget.trial_timeout_s,
            warmup_steps=c.warmup_steps, num_steps=c.num_steps, locked_hashes=dict(self.contract.locked_hashes),
            devices_per_trial=(res.gpus_per_trial or res.cpus_per_trial) * res.nodes_per_trial,
            sim_workload=self.spec.sim_workload, seed=self.spec.search.seed * 100_003 + self._num_ids,
            metrics=self.spec.metrics, gpus_per_trial=res.gpus_per_trial)
        return self._requests[trial_id]

    def workdir_for(self, config: Config) -> Path:
        """Where ``config`` runs: the contract's workdir, or for a config that switches
        patches on, a worktree of the snapshot with those patches (one per patch set,
        made once under the campaign folder). Locked hashes stay the contract's."""
        from infrarsi.patches.patch import contract_patches, enabled_patches

        patches = enabled_patches(config, contract_patches(self.contract))
        if not patches:
            return Path(self.contract.workdir)
        from infrarsi.adapters.git_branch import patch_worktree, repository_root

        repo = repository_root(self.contract.workdir)
        rel_dir = Path(self.contract.workdir).resolve().relative_to(repo)
        key = hashlib.sha256(",".join(p.name for p in patches).encode()).hexdigest()[:10]
        tree = patch_worktree(repo, self.cdir.root / "worktrees" / key, {p.name: p.diff for p in patches},
                              directory=rel_dir.as_posix())
        return tree / rel_dir

    def record(self, result: TrialResult) -> None:
        self.ledger.append_trial(result)
        log = Path(result.log_path) if result.log_path else None
        self.tracker.log_trial(result, log, self.contract.campaign_id)
        if self.settings.on_result:
            self.settings.on_result(result)

    def _loaded(self, result: TrialResult) -> bool:
        return (result.outcome is Outcome.OK
                and result.extra.get("foreign_load_cores", 0.0) > self.spec.resources.max_foreign_load_cores)

    def needs_remeasure(self, result: TrialResult) -> bool:
        """An ok timing taken while other processes loaded the machine is not trusted."""
        return self._loaded(result) and result.attempt <= self.spec.resources.max_remeasures

    def final(self, result: TrialResult) -> TrialResult:
        """A result that is still contaminated when re-measurements run out says so (and
        the campaign warns, once)."""
        if self._loaded(result) and not self.needs_remeasure(result):
            self.cdir.add_warning("measurement", (
                f"some trials' timings stayed contaminated after {self.spec.resources.max_remeasures} "
                "re-measurement(s): other processes loaded the machine while they ran. They are marked "
                "contaminated in the ledger and the report; run the campaign on a quiet machine to trust them"))
            return result.replace(extra={**result.extra, "contaminated": True})
        return result

    def remeasure(self, result: TrialResult) -> tuple[TrialResult, TrialRequest]:
        """The contaminated record (kept, marked as superseded) and the request that re-runs it."""
        load = result.extra["foreign_load_cores"]
        flagged = result.replace(extra={**result.extra, "retried": True, "contaminated": True},
                                 reason=f"measurement contaminated: other processes used {load:.2f} CPU cores "
                                        "during the measured window; measured again")
        return flagged, dataclasses.replace(self._requests[result.trial_id], attempt=result.attempt + 1)

    def run_one(self, config: Config, role: Role, *, check: Callable[[TrialResult], TrialResult] | None = None,
                seed: int | None = None) -> TrialResult:
        """Run a trial to its end on the pool (re-measured while contaminated), record
        every attempt, return the final one."""
        req = self.request(config, role, seed=seed)
        while True:
            attempts = self.pool.run_one(req)
            if seed is not None:  # the job's seed, where it is not the contract's (resume matches on it)
                attempts = [r.replace(extra={**r.extra, "job_seed": seed}) for r in attempts]
            attempts = [check(r) if check else r for r in attempts]
            final = attempts[-1] = self.final(attempts[-1])
            if self.needs_remeasure(final):
                attempts[-1], req = self.remeasure(final)
            for r in attempts:
                self.record(r)
            if attempts[-1] is final:
                return final

    def finish(self, summary: dict, tags: Mapping[str, str] | None = None) -> None:
        """Close the MLflow parent run with the summary's numbers and the report: its two
        files, the summary and its pictures (``plots/``, which the HTML links relatively)."""
        metrics = {k: v for k, v in summary.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        artifacts = [p for p in (self.cdir.report_md, self.cdir.report_html, self.cdir.summary, self.cdir.plots)
                     if p.exists()]
        self.tracker.end_campaign(metrics, artifacts, "FINISHED", tags=tags)

    def fail(self, status: str = "FAILED") -> None:
        """Close the MLflow parent run of a campaign that stopped on an error."""
        self.tracker.end_campaign({}, [], status)

    def drop_pool(self) -> None:
        """Throw the trial slots away after an infrastructure fault: the next ``pool`` is
        a fresh one, and trials that were in flight, never recorded, no longer count
        against the cap."""
        pool, self._pool = self._pool, None
        self._counted = self._finished()
        if pool is None:
            return
        try:
            pool.close()
        except Exception as exc:  # noqa: BLE001 - the slots are discarded because they broke
            log.warning("closing the broken trial pool failed (%s: %s); its actors are abandoned",
                        type(exc).__name__, exc)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()


def _hardware_desc(contract: Contract) -> str:
    from infrarsi.harness import machine

    return machine.describe(dict(contract.hardware))
