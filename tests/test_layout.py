"""The package's shape: subpackages by concept, layered with no import cycle, no module a
reader cannot hold in one sitting.

The layers and the ban on cycles are import-linter contracts in ``pyproject.toml`` (every
import statement counts, those inside functions too: an import moved into a function still
ties the two modules together)."""

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "infrarsi"
MAX_LINES = 400


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def test_the_import_contracts_hold(capsys):
    """Each package imports only the layers below it, and no packages or modules import
    each other in a cycle (the report names each import that breaks a contract)."""
    import importlinter.api  # noqa: F401  (configures import-linter before its use cases run)
    from importlinter.application.use_cases import lint_imports

    kept = lint_imports(config_filename=str(ROOT / "pyproject.toml"), cache_dir=None, no_logo=True)
    assert kept, capsys.readouterr().out


def test_the_package_holds_only_subpackages():
    flat = sorted(p.name for p in PACKAGE.glob("*.py") if p.name != "__init__.py")
    assert flat == []
    # a folder of code is a package; a folder of data (report templates, the lever catalog) holds no code
    for sub in (p for p in PACKAGE.rglob("*") if p.is_dir() and p.name != "__pycache__" and any(p.glob("*.py"))):
        assert (sub / "__init__.py").is_file(), f"{sub} is not a package"


@pytest.mark.parametrize("name,path", sorted(_modules().items()))
def test_no_module_is_over_400_lines(name, path):
    assert len(path.read_text().splitlines()) <= MAX_LINES, f"{name}: split it by concept"
