"""A broken spec fails at load time, before any trial, with an error naming the field."""

import copy
import tomllib
from pathlib import Path

import pytest

from infrarsi.backends import backend_of
from infrarsi.contract.spec_load import load_spec
from infrarsi.core.errors import SpecError
from infrarsi.stages.init import builtin_spec_path

BUILTIN = tomllib.loads(builtin_spec_path().read_text())


def _write(tmp_path: Path, data: dict) -> Path:
    import json

    def fmt(v):
        if isinstance(v, dict):
            return "{ " + ", ".join(f"{k} = {fmt(x)}" for k, x in v.items()) + " }"
        if isinstance(v, list):
            return "[" + ", ".join(fmt(x) for x in v) + "]"
        if isinstance(v, bool):
            return str(v).lower()
        return json.dumps(v)

    lines = [f"{k} = {fmt(v)}" for k, v in data.items() if not isinstance(v, dict) or k == "baseline"]
    for section, body in data.items():
        if isinstance(body, dict) and section != "baseline":
            for k, v in body.items():
                if isinstance(v, dict):
                    lines += [f"[{section}.{k}]"] + [f"{kk} = {fmt(vv)}" for kk, vv in v.items()]
            lines += [f"[{section}]"] + [f"{k} = {fmt(v)}" for k, v in body.items() if not isinstance(v, dict)]
    path = tmp_path / "campaign.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def _spec(**changes) -> dict:
    data = copy.deepcopy(BUILTIN)
    data["workload_dir"] = str(builtin_spec_path().parent)
    for dotted, value in changes.items():
        *parents, leaf = dotted.split(".")
        node = data
        for p in parents:
            node = node[p]
        if value is None:
            del node[leaf]
        else:
            node[leaf] = value
    return data


def test_builtin_spec_loads_and_round_trips(tmp_path):
    spec = load_spec(_write(tmp_path, _spec()))
    assert spec == load_spec(builtin_spec_path()).model_copy(update={"workload_dir": spec.workload_dir})
    assert spec.space.is_feasible(spec.baseline)


def test_builtin_spec_searches_ddp_bucket_sizes_only_between_processes():
    """DDP's buckets do nothing in one process: no one-process config of the built-in
    space has another bucket size than the baseline's, so the search never runs one."""
    spec = load_spec(builtin_spec_path())
    feasible = spec.space.feasible
    assert {c["bucket_mb"] for c in feasible if c["nproc"] == 1} == {spec.baseline["bucket_mb"]}
    assert {c["bucket_mb"] for c in feasible if c["nproc"] > 1} == set(spec.knobs["bucket_mb"].values)


def test_only_real_processes_without_gpus_count_as_cpu_trials(tmp_path):
    """The CPU prior table applies to the built-in CPU job, not to GPU trials and not to the
    simulator, whose trials model GPUs though the harness gives them none."""
    def trials_on_cpu(spec):
        return backend_of(spec).trials_on_cpu(spec)

    assert trials_on_cpu(load_spec(builtin_spec_path()))
    gpu = {**BUILTIN, "workload_dir": str(builtin_spec_path().parent), "resources": {"gpus_per_trial": 1}}
    assert not trials_on_cpu(load_spec(_write(tmp_path, gpu)))
    sim = Path(__file__).resolve().parents[1] / "workloads" / "sim" / "dense-9b-h100.toml"
    assert not trials_on_cpu(load_spec(sim))


@pytest.mark.parametrize("changes, expected", [
    ({"contract.seq_len": None}, r"contract\.seq_len: Field required \(found nothing\)"),
    ({"contract.seq_len": "long"}, r"contract\.seq_len: Input should be a valid integer.*found 'long'"),
    ({"contract.warmup_steps": 9}, r"warmup_steps \(9\) must be below num_steps \(7\)"),
    ({"device.memory_capacity": "lots"}, r"device\.memory_capacity: could not parse value and unit"),
    ({"budget.doctor_repeats": 1}, r"budget\.doctor_repeats: Input should be greater than or equal to 3"),
    ({"turbo": True}, r"turbo: Extra inputs are not permitted"),
    ({"baseline.micro_batch": 3}, r"baseline: knob 'micro_batch': value 3 is not in its domain"),
    ({"baseline.warp_speed": 9}, r"baseline: unknown knob\(s\) \['warp_speed'\]"),
    ({"constraints": ["threads < 2"]}, r"baseline config violates constraint\(s\) \['threads < 2'\]"),
    ({"constraints": ["gpus < 2"]}, r"constraint 'gpus < 2': unknown knob\(s\) \['gpus'\]"),
    ({"command": ["no-such-launcher", "train.py"]}, r"command program 'no-such-launcher' was not found"),
    ({"command": ["{python}", "trian.py"]}, r"command script 'trian.py' does not exist"),
    ({"command": ["{python}", "train.py", "{gpus}"]}, r"command placeholder \{gpus\} is unknown"),
    ({"contract.editable": ["src/**/*.py"]}, r"contract\.editable pattern 'src/\*\*/\*\.py' matches no file"),
    ({"contract.locked": ["data.py", "train.py"]}, r"\['train.py'\] is both locked and editable"),
    ({"knobs.optimizer.flag": None, "knobs.optimizer.placeholder": True},
     r"knobs\.optimizer is a placeholder, but the command has no \{optimizer\}"),
])
def test_broken_spec_names_the_field(tmp_path, changes, expected):
    with pytest.raises(SpecError, match=expected):
        load_spec(_write(tmp_path, _spec(**changes)))


def test_invalid_toml_and_missing_file_say_what_to_do(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("name = \n")
    with pytest.raises(SpecError, match="not valid TOML"):
        load_spec(bad)
    with pytest.raises(SpecError, match="no such spec file"):
        load_spec(tmp_path / "missing.toml")
