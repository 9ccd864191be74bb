"""The core library stands without Prefect: every module of infrarsi imports without it."""

import subprocess
import sys

SCRIPT = """
import importlib, pkgutil, sys
import infrarsi
for m in pkgutil.walk_packages(infrarsi.__path__, "infrarsi."):
    if not m.name.endswith(".__main__"):  # the command itself: importing it runs it
        importlib.import_module(m.name)
print(sorted(n for n in sys.modules if n == "prefect" or n.startswith("prefect.")))
"""


def test_core_imports_no_prefect():
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]"
