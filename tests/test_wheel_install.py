"""An installed wheel finds the built-in patch library and the lever catalog.

The library used to be found as a folder beside the ``infrarsi`` package, which exists in
a checkout but not in site-packages, so an installed wheel silently had no built-in
patches. This test builds the wheel, installs it into a fresh virtualenv and asks that
installation for its built-in patches from a folder outside the checkout.
"""

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BUILTIN_NAMES = ["cached_causal_mask", "checkpoint_lm_head", "chunked_cross_entropy", "ddp_bucket_view"]
# Build outputs and environments of the checkout; the rest is what an sdist would hold.
# ".venv*": CI's environment (.venv-ci, 2.3 GB with torch) lies in the checkout, and
# copying it took most of this test's minute there.
NOT_SOURCE = shutil.ignore_patterns(".git", ".venv*", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache",
                                    "runs", "campaigns", "mlruns", "mlflow.db", ".prefect", ".gpu_wheels")
PROBE = """
import json, infra_patches, infrarsi
from infrarsi.discover.levers import load_catalog
from infrarsi.patches.patch import builtin_patches
print(json.dumps({"infrarsi": infrarsi.__file__, "infra_patches": infra_patches.__file__,
                  "names": sorted(p.name for p in builtin_patches()),
                  "families": sorted(f.family for f in load_catalog())}))
"""


def _run(*argv, **kwargs):
    return subprocess.run(argv, capture_output=True, text=True, check=True, timeout=300, **kwargs)


def test_a_wheel_installed_into_a_fresh_venv_finds_the_builtin_patches(tmp_path):
    # A copy, because pip builds a local project in place and would leave build/ and
    # *.egg-info in the checkout.
    source = shutil.copytree(REPO, tmp_path / "source", ignore=NOT_SOURCE)
    wheels = tmp_path / "wheels"
    _run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(wheels),
         str(source))
    (wheel,) = wheels.glob("infrarsi-*.whl")
    venv = tmp_path / "venv"
    _run(sys.executable, "-m", "venv", "--without-pip", str(venv))
    venv_python = venv / "bin" / "python"
    _run(sys.executable, "-m", "pip", "--python", str(venv_python), "install", "--no-deps", "-q", str(wheel))

    # The dependencies come from this interpreter's site-packages on PYTHONPATH; a folder
    # on PYTHONPATH does not run its .pth files, so the checkout's editable install of
    # infrarsi stays out of the way (checked below: the import comes from the venv).
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    env = {**os.environ, "PYTHONPATH": sysconfig.get_paths()["purelib"], "PYTHONNOUSERSITE": "1"}
    out = _run(str(venv_python), "-c", PROBE, cwd=outside, env=env)
    found = json.loads(out.stdout)

    installed = (venv / "lib").resolve()
    assert Path(found["infrarsi"]).resolve().is_relative_to(installed), found
    assert Path(found["infra_patches"]).resolve().is_relative_to(installed), found
    assert found["names"] == BUILTIN_NAMES
    catalog = sorted(p.stem for p in (REPO / "infrarsi" / "discover" / "levers").glob("*.toml"))
    assert found["families"] == catalog and "hf_trainer" in catalog
