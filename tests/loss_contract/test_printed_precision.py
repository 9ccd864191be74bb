"""The loss contract reads a loss only as precisely as the job prints it: a job whose lines
round its loss to 2, 4 or 6 significant digits, read through the log adapter as a campaign
reads it. One flip of the last printed digit is no deviation; a sustained 0.1% shift is one
wherever the printed digits can show it, and where they cannot (2 digits), the contract says
so instead of calling the shift equivalent."""

import math

import pytest

from infrarsi.contract.loss_contract import ClassReference, LossContract
from infrarsi.core.spec_metrics import MetricsSpec
from infrarsi.core.trial import Outcome, Role, TrialResult
from infrarsi.harness.log_adapter import LogAdapter, printed_quantum, printed_unit

TRUE = [5.2 * math.exp(-0.02 * i) + 0.013 * math.sin(i) for i in range(20)]  # a falling loss, not on any grid


def _printed(losses, digits):
    """The run as the job prints it, read back by the log adapter: (losses, the unit of the last digit)."""
    adapter = LogAdapter(MetricsSpec(source="log", step_pattern=r"'loss': '(?P<loss>[-+0-9.eE]+)'", tokens_per_step=64))
    events = [e for i, loss in enumerate(losses) for e in adapter.feed(f"{{'loss': '{loss:.{digits}g}', 'step': {i}}}")]
    return tuple(e["loss"] for e in events), printed_unit([e["loss_quantum"] for e in events])


def _contract(reference, quantum):
    return LossContract(signal="step", window=4, baseline={}, changing_knobs=(), loss_quantum=quantum,
                        classes=(ClassReference(settings=(), losses=reference, tolerance=3e-6),))


def _problems(contract, losses):
    ref, _ = contract.reference_for({})
    return ref.problems(TrialResult(trial_id="t", config={}, role=Role.SEARCH, outcome=Outcome.OK, step_time_s=0.1,
                                    losses=losses))


def test_the_printed_unit_is_read_off_the_text():
    assert printed_quantum("5.158") == pytest.approx(1e-3) and printed_quantum("5.2") == pytest.approx(0.1)
    assert printed_quantum("5.15e-03") == pytest.approx(1e-5) and printed_quantum("7") == 1.0


@pytest.mark.parametrize("digits", [2, 4, 6])
def test_a_one_digit_flip_passes_and_a_sustained_shift_fails_where_the_digits_show_it(digits):
    reference, quantum = _printed(TRUE, digits)
    contract = _contract(reference, quantum)
    assert quantum == pytest.approx(10.0 ** (1 - digits))  # losses of 5.x and 4.x: the last digit's unit
    # an honest change far below the printed precision flips the last digit at some step
    flipped = list(reference)
    flipped[7] += quantum
    assert not _problems(contract, tuple(flipped))
    resolution = contract.resolution()
    assert f"to {digits} significant digits" in resolution
    shifted, _ = _printed([v * 1.001 for v in TRUE], digits)  # a sustained 0.1% shift
    if quantum / min(TRUE) < 1e-3:
        assert _problems(contract, shifted), f"a 0.1% shift passed at {digits} digits"
    else:  # two digits: a unit of 2% hides it, and the contract says that it cannot see it
        assert not _problems(contract, shifted)
        hidden = float(resolution.split("smaller than ")[1].split(" ")[0])
        assert hidden > 1e-3


def test_a_job_at_full_precision_is_held_to_the_near_exact_tolerance():
    contract = _contract(tuple(TRUE), 0.0)
    assert contract.resolution() == ""
    assert _problems(contract, tuple(v * (1 + 1e-5) for v in TRUE))  # 10x the tolerance
