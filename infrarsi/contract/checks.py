"""Contract checks applied to every finished trial before anything may learn from it.

A trial that ran to the end but broke the contract becomes ``contract_violation`` with
the reason; it is recorded, never promoted, and the search sees it as a failure.
"""

from __future__ import annotations

from infrarsi.contract.loss_contract import LossContract
from infrarsi.contract.loss_reference import LossReference
from infrarsi.core.spec import ContractSpec
from infrarsi.core.trial import Outcome, TrialResult
from infrarsi.harness.launcher import STAMP_LATENCY_S

# Per measured step: what an honest job's own step timer may leave out of the harness's
# interval (the tiny GPT job's reported steps were 7 ms short of the harness's per step
# at load average 31 on 2 cores). Steps shorter than this are not cross-checked usefully.
UNTIMED_GAP_S = 0.01

def contract_problems(result: TrialResult, contract: ContractSpec,
                      reference: LossReference | LossContract | None) -> list[str]:
    """Every way an ok trial broke the contract; empty when it kept it. ``reference`` is a
    ``LossReference`` or a class-aware set of them (``LossContract``), which picks the
    reference in the trial's own numerics."""
    problems: list[str] = []
    if result.extra.get("simulated"):  # the simulator honours the workload by construction
        return problems
    start = result.extra.get("start") or {}
    if start.get("seq_len") is not None and start["seq_len"] != contract.seq_len:
        problems.append(f"sequence length {start['seq_len']} != contract {contract.seq_len}")
    if result.tokens_per_step != contract.global_batch_tokens:
        problems.append(f"tokens per step {result.tokens_per_step} != contract {contract.global_batch_tokens}")
    if len(result.losses) != contract.num_steps:
        problems.append(f"reported {len(result.losses)} losses for {contract.num_steps} steps")
    problems += _timing_problems(result, contract)
    if reference is not None and not isinstance(reference, LossReference):
        reference, missing = reference.reference_for(result.config)
        if missing:
            problems.append(missing)
    if reference is not None:
        problems += reference.problems(result)
    return problems


def _timing_problems(result: TrialResult, contract: ContractSpec) -> list[str]:
    """The workload's own step times must agree with the harness clock over the window."""
    reported = result.extra.get("reported_step_times_s") or []
    window = reported[contract.warmup_steps:contract.num_steps]
    if not window or not result.step_times_s:
        return []
    harness_s, workload_s = sum(result.step_times_s), sum(window)
    # The harness stamps each line when it arrives: allow a reader's wake-up at either end
    # of the window, and per step the time an honest job's timer leaves out (writing its
    # line, the loop around it, a scheduler slice when the machine is busy).
    slack_s = (contract.timing_tolerance * harness_s + 2 * STAMP_LATENCY_S
               + len(result.step_times_s) * UNTIMED_GAP_S)
    if abs(harness_s - workload_s) > slack_s:
        return [f"workload-reported step time {workload_s:.3f} s disagrees with the harness clock "
                f"{harness_s:.3f} s over the measured window"]
    return []


def enforce(result: TrialResult, contract: ContractSpec,
            reference: LossReference | LossContract | None) -> TrialResult:
    if result.outcome is not Outcome.OK:
        return result
    problems = contract_problems(result, contract, reference)
    if not problems:
        return result
    return result.replace(outcome=Outcome.CONTRACT_VIOLATION, reason="; ".join(problems))
