"""Reading a campaign spec: TOML to a validated ``CampaignSpec``, over the fields its backend
supplies itself (a ``backend = "sim"`` spec's come from the simulator's workload), then the
checks that need the whole spec or the file system (the baseline and calibration against the
space; for a backend that runs code, the command's placeholders and the contract's globs).
Every error names the field, what was expected and what was found.
"""

from __future__ import annotations

import itertools
import math
import shutil
import string
import tomllib
from pathlib import Path

from pydantic import ValidationError

from infrarsi.backends.backend import ProcessBackend, backend_named, backend_of
from infrarsi.core.errors import SpecError
from infrarsi.core.files import matching_files
from infrarsi.core.spec import CONTRACT_PLACEHOLDERS, CampaignSpec, FixedProduct


def _describe(err: dict) -> str:
    where = ".".join(str(p) for p in err["loc"]) or "(top level)"
    found = err.get("input")
    found_text = "nothing" if err["type"] == "missing" else repr(found)
    if len(found_text) > 80:
        found_text = found_text[:77] + "..."
    return f"  {where}: {err['msg']} (found {found_text})"


def parse_spec(data: dict, *, source: str, base_dir: Path) -> CampaignSpec:
    backend = backend_named(data.get("backend", ProcessBackend.name))
    if backend is not None:  # else validation names the field
        data = backend.spec_data(data, source)
    try:
        spec = CampaignSpec.model_validate(data)
    except ValidationError as exc:
        lines = [_describe(e) for e in exc.errors()]
        raise SpecError(f"{source}: invalid campaign spec; fix these fields:\n" + "\n".join(lines)) from None
    spec = spec.model_copy(update={"workload_dir": (base_dir / spec.workload_dir).resolve()})
    check_consistency(spec, source)
    return spec


def load_spec(path: Path | str) -> CampaignSpec:
    path = Path(path)
    if not path.is_file():
        raise SpecError(f"{path}: no such spec file; pass the path of a campaign TOML "
                        "(or nothing, for the built-in workload)")
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(f"{path}: not valid TOML ({exc}); fix the syntax and retry") from None
    return parse_spec(data, source=str(path), base_dir=path.parent)


def check_consistency(spec: CampaignSpec, source: str) -> None:
    """Cross-field checks pydantic cannot express; all run before any trial."""
    if spec.patches and not backend_of(spec).runs_code:
        raise SpecError(f"{source}: patches need backend = 'process' (the simulator runs no code); "
                        "remove them or run the real job")
    space = spec.space  # raises SpecError for bad knob names or constraint syntax
    baseline = space.validate(spec.baseline, what=f"{source}: baseline")
    _check_fixed_products(spec, baseline, source)
    broken = space.violated(baseline)
    if broken:
        raise SpecError(f"{source}: the baseline config violates constraint(s) {broken}; "
                        "the baseline must be a feasible config: fix the constraint or the baseline")
    for i, variant in enumerate(spec.calibration):
        cfg = space.validate({**spec.baseline, **variant}, what=f"{source}: calibration[{i}]")
        if space.violated(cfg):
            raise SpecError(f"{source}: calibration[{i}] violates constraint(s) {space.violated(cfg)}")
    if not backend_of(spec).runs_code:
        return
    if not spec.workload_dir.is_dir():
        raise SpecError(f"{source}: workload_dir {spec.workload_dir} is not a directory")
    _check_command(spec, source)
    for field in ("editable", "locked"):
        for pattern in getattr(spec.contract, field):
            if not matching_files(spec.workload_dir, [pattern]):
                raise SpecError(f"{source}: contract.{field} pattern {pattern!r} matches no file under "
                                f"{spec.workload_dir}; fix the glob (it is relative to workload_dir)")
    both = sorted(set(matching_files(spec.workload_dir, spec.contract.editable))
                  & set(matching_files(spec.workload_dir, spec.contract.locked)))
    if both:
        raise SpecError(f"{source}: {both[:5]} {'is' if len(both) == 1 else 'are'} both locked and editable "
                        "(contract.locked, contract.editable): a locked file may not change and an editable one is "
                        "what a patch changes; keep each file in one of the lists")


def _check_fixed_products(spec: CampaignSpec, baseline: dict, source: str) -> None:
    for i, fp in enumerate(spec.fixed_products):
        where = f"{source}: fixed_products[{i}]"
        for name in fp.knobs:
            bad = [v for v in spec.knobs[name].values if isinstance(v, bool) or not isinstance(v, int)]
            if bad:
                raise SpecError(f"{where}: knob {name!r} must take whole numbers to keep a product; found {bad}")
        product = math.prod(int(baseline[n]) for n in fp.knobs)
        if product != fp.value:
            factors = " x ".join(f"{n} {baseline[n]}" for n in fp.knobs)
            raise SpecError(f"{where}: the baseline's {factors} = {product}, but the product must stay {fp.value}; "
                            "set the baseline to a split that keeps it (or fix value)")
        if not any(True for _ in _products_other_than(spec, fp, baseline)):
            raise SpecError(f"{where}: no other combination of {fp.knobs}'s values keeps the product {fp.value}; "
                            "add values that do (e.g. halve one, double the other)")


def _products_other_than(spec: CampaignSpec, fp: FixedProduct, baseline: dict):
    for combo in itertools.product(*(spec.knobs[n].values for n in fp.knobs)):
        if math.prod(combo) == fp.value and list(combo) != [baseline[n] for n in fp.knobs]:
            yield combo


def _check_command(spec: CampaignSpec, source: str) -> None:
    placeholders = {n for n, k in spec.knobs.items() if k.placeholder}
    known = set(CONTRACT_PLACEHOLDERS) | placeholders
    used = {name for token in spec.command for name in _placeholders(token)}
    for name in sorted(used - known):
        raise SpecError(f"{source}: command placeholder {{{name}}} is unknown; use one of {sorted(known)}")
    program = spec.command[0]
    if program != "{python}" and shutil.which(program) is None and not (spec.workload_dir / program).exists():
        raise SpecError(f"{source}: command program {program!r} was not found on PATH or in workload_dir")
    for token in spec.command[1:]:
        if token.endswith(".py") and "{" not in token and not (spec.workload_dir / token).is_file():
            raise SpecError(f"{source}: command script {token!r} does not exist under {spec.workload_dir}")
    for name in sorted(placeholders - used):
        raise SpecError(f"{source}: knobs.{name} is a placeholder, but the command has no {{{name}}}: put it where "
                        "the job takes the value, or give the knob a flag or env instead")


def _placeholders(token: str) -> list[str]:
    return [name for _, name, _, _ in string.Formatter().parse(token) if name]
