"""The lever catalog: what a job of each trainer family can be tuned with beyond the flags
it was typed with, kept as data (``levers/<family>.toml``, one file a family).

Each lever names how it reaches the job (an entry ``flag``, an ``env`` variable or a
``launcher`` option), its kind (so the built-in priors apply), its candidate values, its
numerics class, the devices it applies to and a one-line reason with its source:

- ``keeps``: the same arithmetic up to reordering (a kernel, a split, threads): searched;
- ``declared``: a declared change of numerics (precision): searched, each value compared
  with a reference run of its own;
- ``trains``: changes what is trained (batch composition, truncation, packing): never offered;
- ``never``: documented as unsafe or as no speed lever (NCCL's debugging variables): never offered.

A family says how ``infrarsi init`` recognises it (``[detect]``: the program, launcher,
entry module or script typed, flags its ``--help`` lists, a file its dry run read, a
pattern in the script's source) and may say where its flags are read besides ``--help``
(``[settings]``). ``[[couplings]]`` are constraints between knobs of two kinds. Adding a
family is adding a file; ``load_catalog`` validates every file and names the field at fault.
"""

from __future__ import annotations

import functools
import re
import tomllib
from dataclasses import dataclass
from importlib import resources
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from infrarsi.core.errors import InfrarsiError
from infrarsi.core.knobs import KNOB_KINDS
from infrarsi.discover.knobs import powers_of_two

Scalar = bool | int | float | str
OFFERED = ("keeps", "declared")  # the numerics classes a search may try


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Lever(_Model):
    name: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", description="the knob's name in a spec")
    flag: str | None = Field(default=None, description="the entry's flag as typed: '--optim', or 'compile' "
                             "for key=value overrides")
    env: str | None = None
    launcher: list[str] = Field(default=[], description="the launcher's option, each spelling it accepts")
    kind: Literal[KNOB_KINDS]
    values: list[Scalar] | Literal["cpus", "processes"] = Field(
        description="candidate values; 'cpus': powers of two up to a trial's cores; 'processes': up to its "
        "devices (GPUs, or cores on a CPU)")
    default: Scalar | Literal["torch"] | None = Field(
        default=None, description="the value the job runs when the command does not set it ('torch': torch's "
        "own thread count, read in the job's interpreter); unset: only where the command or --help says")
    levels: dict[str, Scalar] = {}
    numerics: Literal["keeps", "declared", "trains", "never"]
    devices: list[Literal["cpu", "cuda"]] = Field(min_length=1)
    style: Literal["separate", "equals", "switch"] | None = None
    only_typed: bool = Field(default=False, description="a lever only where the command sets it")
    min_processes: int = Field(default=1, ge=1, description="offered only where a trial may run this many")
    why: str = Field(min_length=1)
    coupling: str = ""
    source: str = ""

    @property
    def key(self) -> str:
        """The flag's name as ``infrarsi.discover.command`` normalises one."""
        return normal(self.flag) if self.flag else ""

    @property
    def offered(self) -> bool:
        return self.numerics in OFFERED

    def applies(self, device: str, max_processes: int) -> bool:
        return device in self.devices and max_processes >= self.min_processes


class Detect(_Model):
    always: bool = False
    programs: list[str] = []   # the program typed: trl, litgpt, tune
    launchers: list[str] = []  # torchrun, accelerate
    modules: list[str] = []    # the entry module (-m torchtitan.train)
    scripts: list[str] = []    # the script's file name (pretrain_gpt.py)
    help: list[str] = []       # flags --help lists, every one of them
    files: list[str] = []      # a file the dry run read, by name
    source: list[str] = []     # a regular expression the script's source matches


class Settings(_Model):
    config_flag: str | None = Field(default=None, description="the flag naming a YAML config file whose keys "
                                    "are key=value overrides")
    python: bool = Field(default=False, description="module-level settings of the script and of the .py "
                         "config files given are --key=value flags")


class Coupling(_Model):
    kinds: list[Literal[KNOB_KINDS]] = Field(min_length=2, max_length=2)
    constraint: str
    devices: list[Literal["cpu", "cuda"]] = Field(min_length=1)
    why: str


class Family(_Model):
    family: str
    title: str
    note: str = Field(default="", description="what a spec of this family must say to its reader")
    sets_env: dict[str, Scalar] = Field(default={}, description="variables this launcher sets in its "
                                        "processes where the environment leaves them unset and it starts more "
                                        "than one")
    detect: Detect
    settings: Settings = Settings()
    levers: list[Lever] = []
    couplings: list[Coupling] = []


@dataclass(frozen=True, kw_only=True)
class JobFacts:
    """What init knows of a job when it picks its families."""

    program: str = ""                 # the typed program's file name (python, trl, torchrun)
    launcher: str = "python"          # python | torchrun | accelerate | program
    module: str | None = None         # the entry module of python -m
    script: str | None = None
    help: frozenset[str] = frozenset()  # normalised names of the flags --help lists
    files_read: tuple[str, ...] = ()
    source: str = ""                  # the script's text, where there is a script


def normal(flag: str) -> str:
    """A flag's name without dashes, '-' as '_', lower case: ``--nproc-per-node`` -> ``nproc_per_node``."""
    return flag.lstrip("-").replace("-", "_").lower()


@functools.cache
def load_catalog() -> tuple[Family, ...]:
    """Every family file of ``levers/``, validated, in name order."""
    folder = resources.files("infrarsi.discover") / "levers"
    families = []
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".toml"):
            families.append(parse_family(entry.read_text(), source=f"levers/{entry.name}"))
    return tuple(families)


def parse_family(text: str, *, source: str) -> Family:
    try:
        family = Family.model_validate(tomllib.loads(text))
    except tomllib.TOMLDecodeError as exc:
        raise InfrarsiError(f"lever catalog {source}: not valid TOML ({exc})") from None
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        raise InfrarsiError(f"lever catalog {source}: {where}: {err['msg']} (got {err.get('input')!r})") from None
    for lever in family.levers:
        reaches = sum([lever.flag is not None, lever.env is not None, bool(lever.launcher)])
        if reaches != 1:
            raise InfrarsiError(f"lever catalog {source}: lever {lever.name!r} must give exactly one of flag, env, "
                                f"launcher (it gives {reaches})")
        if lever.offered and not lever.values:
            raise InfrarsiError(f"lever catalog {source}: lever {lever.name!r} is offered ({lever.numerics}) but "
                                "lists no values")
    return family


def detected(family: Family, job: JobFacts) -> bool:
    """Whether ``job`` is of ``family``: any one of its detect rules holds."""
    d = family.detect
    names = {p.rsplit("/", 1)[-1] for p in job.files_read}
    return (d.always or job.program in d.programs or job.launcher in d.launchers
            or (job.module is not None and job.module in d.modules)
            or (job.script is not None and job.script.rsplit("/", 1)[-1] in d.scripts)
            or (bool(d.help) and {normal(f) for f in d.help} <= job.help)
            or bool(names & set(d.files))
            or (bool(job.source) and any(re.search(p, job.source) for p in d.source)))


def families_of(job: JobFacts, catalog: tuple[Family, ...] | None = None) -> tuple[Family, ...]:
    """The families ``job`` belongs to (the generic ones included), in catalog order."""
    return tuple(f for f in (catalog if catalog is not None else load_catalog()) if detected(f, job))


def candidate_values(lever: Lever, *, cpus: int, devices: int) -> list[Any]:
    """The lever's candidates on this machine: ``cpus`` and ``processes`` become powers of two."""
    if lever.values == "cpus":
        return powers_of_two(max(cpus, 1))
    if lever.values == "processes":
        return powers_of_two(max(devices, 1))
    return list(lever.values)
