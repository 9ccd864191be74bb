import pytest

from infrarsi.sim.calibration import CALIBRATION_POINTS


@pytest.mark.parametrize("point", CALIBRATION_POINTS, ids=lambda p: p.name)
def test_simulated_mfu_within_20_percent_of_published(point):
    sim = point.simulated_mfu()
    assert abs(sim / point.published_mfu - 1) <= 0.20, f"{point.name}: simulated {sim:.3f} vs {point.published_mfu}"
