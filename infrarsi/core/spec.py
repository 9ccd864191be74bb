"""The campaign spec: a TOML file validated by pydantic.

Everything a campaign needs to know about the job it tunes lives here: how to launch it,
which knobs exist and how each reaches the job, the baseline config, the contract, the
device capacity, the budget and the resources per trial. ``contract.spec_load`` reads a file
into it and turns every problem into one ``SpecError`` that names the field, what was
expected and what was found.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ByteSize, ConfigDict, Field, model_validator

from infrarsi.core.knobs import FLAG_STYLES, KNOB_KINDS, Constraint, Knob, KnobSpace, patch_knob_name
from infrarsi.core.spec_metrics import MetricsSpec

Scalar = bool | int | float | str
# Placeholders every command template may use, besides knobs declared `placeholder = true`:
# last_step is num_steps - 1, for a step flag whose loop runs 0..N inclusive; num_tokens is
# num_steps x global_batch_tokens, for a job that counts its length in tokens.
CONTRACT_PLACEHOLDERS = ("python", "seq_len", "global_batch_tokens", "num_steps", "last_step", "num_tokens", "seed")
# Environment the harness owns (the metrics file it reads); no knob or spec may set it.
RESERVED_ENV_PREFIX = "INFRARSI_"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class KnobSpec(_Model):
    values: list[Scalar] = Field(min_length=1)
    flag: str | None = Field(default=None, description="the flag as the job spells it: '--batch_size', "
                             "'--micro-batch', or 'batch_size' for key=value configurators")
    flag_style: Literal[FLAG_STYLES] | None = Field(
        default=None, description="'separate' (--k v), 'equals' (--k=v, k=v) or 'switch' (--k when true); "
        "unset: the spec's flag_style")
    env: str | None = None
    placeholder: bool = False
    description: str = ""
    kind: Literal[KNOB_KINDS] | None = Field(
        default=None, description="what the knob does, so the built-in priors apply whatever its name; "
        "unset: the priors look the knob up by name")
    levels: dict[str, Scalar] = Field(
        default={}, description="value -> the priors' spelling, e.g. {float32 = 'fp32', bfloat16 = 'bf16'}")
    numerics: Literal["keeps", "changes"] | None = Field(
        default=None, description="whether a value other than the baseline's changes the job's numerics "
        "(precision) or keeps them up to reordering (micro-batch split, threads, kernels); unset: "
        "precision-like knobs change them, others keep them (infrarsi.contract.numerics)")

    @model_validator(mode="after")
    def _no_smuggling(self) -> "KnobSpec":
        # A value is one argv entry, never spliced into a shell; one that looks like more
        # arguments ("2 --steps 1") is a mistake or an attempt to change the contract.
        if self.flag is not None or self.placeholder:
            for v in self.values:
                if isinstance(v, str) and (v != v.strip() or " " in v or v.startswith("-")):
                    raise ValueError(f"value {v!r} looks like extra command-line arguments; a knob value "
                                     "must be one token without spaces that does not start with '-'")
        if self.env is not None and self.env.startswith(RESERVED_ENV_PREFIX):
            raise ValueError(f"env {self.env!r} is reserved for the harness (INFRARSI_*); choose another name")
        spelled = {_level_key(v) for v in self.values}
        unknown = [k for k in self.levels if k not in spelled]
        if unknown:
            raise ValueError(f"levels names {unknown}, which are not among values {self.values}; "
                             "each levels key must be one of the knob's values")
        return self

    def level_pairs(self) -> tuple[tuple[Scalar, Scalar], ...]:
        return tuple((v, self.levels[_level_key(v)]) for v in self.values if _level_key(v) in self.levels)


def _level_key(value: Scalar) -> str:
    """A knob value as a TOML table key: true/false for booleans, else str()."""
    return str(value).lower() if isinstance(value, bool) else str(value)


class FixedProduct(_Model):
    """Knobs whose product the job needs constant, e.g. micro-batch x gradient accumulation
    = sequences per optimizer step: only configs that keep it are feasible."""

    knobs: list[str] = Field(min_length=2)
    value: int = Field(gt=0, description="the product every config keeps (the baseline's, e.g. 40)")

    @property
    def constraint(self) -> str:
        return f"{' * '.join(self.knobs)} == {self.value}"


class ContractSpec(_Model):
    seq_len: int = Field(gt=0)
    global_batch_tokens: int = Field(gt=0)
    num_steps: int = Field(gt=1, description="optimizer steps per trial, warm-up included")
    warmup_steps: int = Field(ge=1, description="steps before the measured window (compile, allocator warm-up)")
    seed: int = 1234
    loss_tolerance: float | None = Field(
        default=None, gt=0, description="max relative loss deviation (mean or trend over the trajectory) in "
        "every numerics class; unset: doctor calibrates one per class")
    min_loss_tolerance: float = Field(
        default=3e-6, gt=0, description="floor of a calibrated tolerance: fp32 reordering (micro-batch split, "
        "kernels) moved the reference trainer's loss statistics by 4e-8 to 4e-7 in 7 steps")
    loss_signal: Literal["step", "window", "eval"] = Field(
        default="step", description="what is compared: 'step' where the per-step loss is a deterministic "
        "function of the global batch; 'window' (a moving mean over loss_window steps) or 'eval' (the job's "
        "eval losses) where it is not, e.g. a job that reports its last micro-batch's loss")
    loss_window: int = Field(default=4, ge=2, description="steps per moving mean (loss_signal = 'window')")
    timing_tolerance: float = Field(default=0.15, gt=0, description="allowed relative gap between the "
                                    "workload's step times and the harness clock over the measured window")
    editable: list[str] = Field(default=[], description="globs a code patch may touch; none: no patch is tried")
    locked: list[str] = Field(min_length=1, description="globs hashed at init and re-checked around trials: what "
                              "defines what is trained (model code, data, config files)")

    @model_validator(mode="after")
    def _window(self) -> "ContractSpec":
        if self.warmup_steps >= self.num_steps:
            raise ValueError(f"warmup_steps ({self.warmup_steps}) must be below num_steps ({self.num_steps})")
        if self.loss_signal == "window" and self.loss_window > self.num_steps:
            raise ValueError(f"loss_window ({self.loss_window}) must be at most num_steps ({self.num_steps})")
        if self.global_batch_tokens % self.seq_len:
            raise ValueError(f"global_batch_tokens ({self.global_batch_tokens}) must be a multiple of "
                             f"seq_len ({self.seq_len})")
        return self


class ReproduceSpec(_Model):
    """What ``infrarsi init`` saw the user's own command print. Doctor's first baseline run
    must print the same before anything is searched: the spec runs the job the user gave."""

    command: list[str] = Field(min_length=1, description="the command as typed (an environment prefix included)")
    first_loss: float | None = Field(default=None, description="the loss of its first step line")
    tokens_per_step: int | None = Field(default=None, gt=0, description="what its tokens line stated")
    lines: list[str] = Field(default=[], description="start-up lines that state the model (parameter counts)")


class DeviceSpec(_Model):
    memory_capacity: ByteSize = Field(description="per-trial memory capacity, e.g. '1.5GiB'")
    emulate_capacity: bool = Field(default=True, description="kill the trial's process tree above capacity")


class ResourcesSpec(_Model):
    gpus_per_trial: int = Field(default=0, ge=0)
    cpus_per_trial: float = Field(default=1, gt=0)
    concurrency: int | None = Field(default=None, ge=1, description="parallel trial slots; unset: "
                                    "the number of independent device slots")
    max_foreign_load_cores: float = Field(
        default=0.5, ge=0, description="CPU cores other processes may use during a measured window "
        "before the measurement counts as contaminated and is taken again")
    max_remeasures: int = Field(default=2, ge=0, description="re-measurements of a contaminated trial")
    # Trials that span nodes (infrarsi/harness/multinode.py): a Ray placement group of
    # nodes_per_trial bundles, each gpus_per_trial GPUs and cpus_per_trial CPUs.
    nodes_per_trial: int = Field(default=1, ge=1, description="nodes one trial spans; above 1 the "
                                 "command must be a torchrun line (c10d rendezvous on the first node)")
    processes_per_node: int | None = Field(default=None, ge=1, description="torchrun --nproc-per-node on "
                                           "each node of a multi-node trial; unset: the command's own")
    placement_strategy: Literal["STRICT_SPREAD", "PACK"] = Field(
        default="STRICT_SPREAD", description="STRICT_SPREAD: one bundle per distinct node; PACK: as few "
        "nodes as fit")
    placement_timeout_s: float = Field(default=60, gt=0, description="a placement group not placed by then "
                                       "is removed and the trial fails")
    node_resources: dict[str, float] = Field(default={}, description="custom Ray resources each node "
                                             "bundle asks for (e.g. a node type)")
    # MFU (infrarsi/stages/report/mfu.py): omitted on CPU, never invented.
    accelerator: str | None = Field(default=None, description="device name for the peak-FLOP/s table "
                                    "when the job does not report one, e.g. 'NVIDIA H100 80GB HBM3'")
    peak_flops_per_device: float | None = Field(default=None, gt=0, description="dense bf16 FLOP/s per "
                                                "device, for a device the table does not know")
    flops_per_token: float | None = Field(default=None, gt=0, description="model FLOPs of one training "
                                          "token, for a job whose start event does not report them")


class BudgetSpec(_Model):
    num_trials: int = Field(default=24, ge=1, description="search trials")
    max_trials: int | None = Field(
        default=None, ge=1, description="trials the whole campaign may run, every stage included (a "
        "re-measured trial counts once); unset: the most the protocol plans (infrarsi.stages.budget)")
    trial_timeout_s: float = Field(default=180, gt=0)
    doctor_repeats: int = Field(default=3, ge=3)
    num_finalists: int = Field(default=4, ge=1, description="configs verification may measure as finalists; "
                               "a runner-up only while the time model gives it a real chance of being fastest")
    verify_pairs: int = Field(default=30, ge=2, description="the most paired rounds a finalist runs; it stops "
                              "as soon as the sequential test decides, or clearing has become unlikely "
                              "(infrarsi.stages.run.sequential), so only a close decision on a noisy machine "
                              "runs them all")
    practical_margin: float = Field(
        default=0.01, ge=0, lt=0.5, description="the smallest speedup worth having: verification promotes "
        "a config whose paired lower bound clears 1 + this, and minimization drops a change as equivalent "
        "when leaving it out is shown to cost less than this")
    doctor_max_repeats: int = Field(
        default=5, ge=3, description="baseline runs doctor may take in all when the noise estimate is weak")
    minimize_pairs: int = Field(
        default=3, ge=0, description="the most paired rounds that measure a change the time model cannot "
        "call by leaving it out; 0: promote the verified winner as it is")


class ObjectiveSpec(_Model):
    """How long the real job runs. Unset: the objective is the step time alone; set: the
    job's total time, start-up plus steps x step time (what the user pays)."""

    job_steps: int | None = Field(default=None, gt=0, description="optimizer steps of the real job")
    job_hours: float | None = Field(default=None, gt=0, description="hours the real job runs at the baseline")

    @model_validator(mode="after")
    def _one_length(self) -> "ObjectiveSpec":
        if self.job_steps is not None and self.job_hours is not None:
            raise ValueError("give job_steps or job_hours, not both")
        return self


class SearchSpec(_Model):
    proposer: str = "engine"
    seed: int = 0
    batch_size: int | None = Field(default=None, ge=1)
    patch_rounds: int = Field(default=2, ge=0, description="times the run asks for code patches (after doctor, "
                              "then when the search stalls); 0: never")


class LLMSpec(_Model):
    base_url: str = Field(description="an OpenAI-compatible endpoint, e.g. http://127.0.0.1:8000/v1")
    model: str
    api_key_env: str = Field(default="OPENAI_API_KEY", description="the variable holding the key")
    timeout_s: float = Field(default=60.0, gt=0)
    max_retries: int = Field(default=2, ge=0)


class CampaignSpec(_Model):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    description: str = ""
    backend: Literal["process", "sim"] = "process"
    sim_workload: str | None = Field(default=None, description="the simulator workload (backend = 'sim')")
    repository: Literal["auto", "copy"] = Field(
        default="copy", description="copy: trials run in a snapshot of workload_dir, a git repository of its own "
        "in the campaign folder, where the branch is staged (your checkout is never touched); auto: trials run "
        "in workload_dir itself and the branch goes to the git repository holding it (say so only if you mean it)")
    workload_dir: Path = Field(description="the target repository (or folder), relative to the spec file")
    command: list[str] = Field(min_length=1, description="the baseline's launch command, token by token: "
                               "{placeholders} where a contract value or a placeholder knob's value stands")
    env: dict[str, str] = {}
    flag_style: Literal[FLAG_STYLES] = Field(
        default="separate", description="how flag knobs are rendered unless a knob says otherwise: "
        "'separate' (--k v), 'equals' (--k=v, k=v), 'switch' (--k when true)")
    knobs: dict[str, KnobSpec] = Field(min_length=1)
    constraints: list[str] = []
    fixed_products: list[FixedProduct] = Field(
        default=[], description="knobs whose product stays constant (micro-batch x accumulation)")
    baseline: dict[str, Scalar]
    calibration: list[dict[str, Scalar]] = Field(
        default=[], description="legitimate variants of the baseline that calibrate the loss tolerance")
    contract: ContractSpec
    device: DeviceSpec
    resources: ResourcesSpec = ResourcesSpec()
    budget: BudgetSpec = BudgetSpec()
    search: SearchSpec = SearchSpec()
    objective: ObjectiveSpec = ObjectiveSpec()
    llm: LLMSpec | None = Field(default=None, description="LLM priors; unset: built-in priors only")
    patches: list[str] = Field(default=[], description="code patches, each a boolean knob patch_<name>: "
                               "built-in names (infra_patches/) or folders relative to the spec file")
    metrics: MetricsSpec = Field(default=MetricsSpec(), description="how the harness reads the job's progress")
    reproduce: ReproduceSpec | None = Field(default=None, description="what the command printed when `infrarsi "
                                            "init` ran it; doctor's first baseline run must print the same")

    @model_validator(mode="after")
    def _declared_tokens(self) -> "CampaignSpec":
        declared = self.metrics.tokens_per_step
        if declared is None:
            return self
        if declared != self.contract.global_batch_tokens:
            raise ValueError(f"metrics.tokens_per_step ({declared}) must equal contract.global_batch_tokens "
                             f"({self.contract.global_batch_tokens}): the job must train the contract's batch")
        # A declared constant is what every step is counted as, so hold it to the job's arguments
        # where the spec says them: a fixed product of a micro-batch and an accumulation knob (by
        # kind) is the sequences per optimizer step when it includes the processes knob or the
        # trial is one process on at most one device (a plain `{python} script.py`). Elsewhere (no
        # kinds, processes outside the product, another launcher) the spec cannot tell the tokens.
        seq_len = self.contract.seq_len
        for i, fp in enumerate(self.fixed_products):
            kinds = [self.knobs[n].kind if n in self.knobs else None for n in fp.knobs]
            if sorted(k for k in kinds if k != "processes") != ["grad_accum", "micro_batch"]:
                continue
            if "processes" not in kinds and not _one_process(self):
                continue
            if declared != fp.value * seq_len:
                raise ValueError(
                    f"metrics.tokens_per_step ({declared}) must equal fixed_products[{i}].value ({fp.value} "
                    f"sequences per optimizer step: {' x '.join(fp.knobs)}) x contract.seq_len ({seq_len}) = "
                    f"{fp.value * seq_len}; fix the declared tokens, the sequence length or the product")
        return self

    @model_validator(mode="before")
    @classmethod
    def _patch_knobs_off_in_baseline(cls, data: dict) -> dict:
        """The baseline runs the code as it is: every patch knob it does not name is False."""
        if isinstance(data, dict) and data.get("patches") and isinstance(data.get("baseline"), dict):
            data = {**data, "baseline": {**{patch_knob_name(p): False for p in data["patches"]}, **data["baseline"]}}
        return data

    @model_validator(mode="after")
    def _harness_env(self) -> "CampaignSpec":
        reserved = [k for k in self.env if k.startswith(RESERVED_ENV_PREFIX)]
        if reserved:
            raise ValueError(f"env {reserved} is reserved for the harness (INFRARSI_*); remove it")
        for i, fp in enumerate(self.fixed_products):
            unknown = [n for n in fp.knobs if n not in self.knobs]
            if unknown:
                raise ValueError(f"fixed_products[{i}] names unknown knob(s) {unknown}; "
                                 f"known knobs are {sorted(self.knobs)}")
        return self

    @property
    def space(self) -> KnobSpace:
        knobs = tuple(Knob(name=n, values=tuple(k.values), flag=k.flag, env=k.env,
                           placeholder=k.placeholder, description=k.description,
                           flag_style=k.flag_style or self.flag_style, kind=k.kind, levels=k.level_pairs())
                      for n, k in self.knobs.items())
        knobs += tuple(Knob(name=patch_knob_name(p), values=(False, True), description=f"code patch {p}")
                       for p in self.patches)
        exprs = [*self.constraints, *(fp.constraint for fp in self.fixed_products)]
        return KnobSpace(knobs, tuple(Constraint(c) for c in exprs))


def _one_process(spec: CampaignSpec) -> bool:
    """A trial is one process on at most one device: ``{python} script.py`` without a processes knob."""
    program = spec.command[0]
    python = program == "{python}" or re.fullmatch(r"python[\d.]*", Path(program).name) is not None
    return (python and len(spec.command) > 1 and spec.command[1].endswith(".py")
            and spec.resources.gpus_per_trial <= 1 and spec.resources.nodes_per_trial == 1
            and not any(k.kind == "processes" for k in spec.knobs.values()))
