"""Shared fixtures. Tests in subfolders import helpers next to this file (synthetic_problem)."""

import os
import sys
import tempfile

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
# Campaigns that name no folder or store use the data folder: never the user's, in tests.
os.environ.setdefault("INFRARSI_DATA_DIR", tempfile.mkdtemp(prefix="infrarsi-test-data-"))
# Prefect's persisted task results (doctor's cache among them) stay in this run: a doctor
# cached by an earlier run of the suite on this machine must not stand in for this one's.
os.environ.setdefault("PREFECT_LOCAL_STORAGE_PATH", tempfile.mkdtemp(prefix="infrarsi-test-prefect-results-"))
# Campaigns in tests neither read nor write an experience bank; bank tests pass a path.
os.environ["INFRARSI_BANK"] = "off"
# As in an activated environment: a command typed `python train.py` or `torchrun ...` (the
# job as a user launches it) finds this interpreter and its console scripts.
os.environ["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])

# Prefect's console log handler binds to sys.stderr when prefect.main is imported: import it
# here, under the session's capture, not first inside a test's capsys (closed when that ends).
import prefect.main  # noqa: E402,F401
import pytest  # noqa: E402
from prefect_server import prefect_server  # noqa: E402,F401  (a session fixture: a real server on loopback)
from staged_campaign import staged_campaigns  # noqa: E402,F401  (a session fixture: two finished sim campaigns)


@pytest.fixture(scope="session")
def ray_session():
    """One local Ray for the whole run, with two logical GPUs to test pinning on a CPU box."""
    import ray

    if not ray.is_initialized():
        ray.init(address="local", num_cpus=4, num_gpus=2, include_dashboard=False, log_to_driver=False,
                 configure_logging=False)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def prefect_harness():
    """One temporary Prefect server for every flow test (each start costs ~11 s)."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness():
        yield
