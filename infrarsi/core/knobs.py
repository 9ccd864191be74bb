"""The knob space: named knobs with finite domains, and constraints between them.

A config is a plain ``dict`` from knob name to value. ``KnobSpace`` validates configs,
enumerates the feasible ones (spaces here are small enough: up to ~1e5), samples them and
gives each a hashable key for de-duplication.
"""

from __future__ import annotations

import ast
import functools
import itertools
import math
import operator
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import PurePosixPath
from typing import Any, Iterable, Iterator, Mapping

import numpy as np

from infrarsi.core.errors import SpecError

Value = int | float | str | bool
Config = dict[str, Value]

# What a knob does, whatever the script calls it: the built-in priors are keyed by kind
# (``infrarsi.engine.builtin_priors``), so ``batch_size`` of kind micro_batch gets the
# micro-batch prior. ``other``: no built-in prior.
KNOB_KINDS = ("micro_batch", "grad_accum", "precision", "compile", "threads", "processes", "checkpointing",
              "attention", "optimizer", "sharding", "bucket", "other")
# How a flag knob is rendered: "separate" `--k v` (two argv entries), "equals" `--k=v` or
# `k=v` (one entry: the flag as written, "=", the value), "switch" `--k` when true, nothing
# when false.
FLAG_STYLES = ("separate", "equals", "switch")


@dataclass(frozen=True, kw_only=True)
class Knob:
    """One launch knob. At most one of ``flag`` / ``env`` / ``placeholder`` says how its
    value reaches the launched job (a placeholder switch also names its flag); none means
    the backend reads it (the simulator)."""

    name: str
    values: tuple[Value, ...]
    flag: str | None = None
    env: str | None = None
    placeholder: bool = False
    description: str = ""
    flag_style: str = "separate"
    kind: str | None = None
    # (value, canonical level) pairs: how the built-in priors spell this knob's values,
    # e.g. (("float32", "fp32"), ("bfloat16", "bf16")). Values not listed stay as they are.
    levels: tuple[tuple[Value, Value], ...] = ()

    def __post_init__(self) -> None:
        if not self.name.isidentifier():
            raise SpecError(f"knob name {self.name!r}: expected an identifier (letters, digits, _)")
        if len(self.values) < 1:
            raise SpecError(f"knob {self.name!r}: expected at least one value, got none")
        if len(set(self.values)) != len(self.values):
            raise SpecError(f"knob {self.name!r}: values must be distinct, got {list(self.values)}")
        modes = sum([self.flag is not None, self.env is not None, self.placeholder])
        # A switch the command gives is a placeholder that renders as its flag or as nothing.
        in_place_switch = self.placeholder and self.flag is not None and self.flag_style == "switch"
        if modes > 1 and not (in_place_switch and self.env is None):
            raise SpecError(f"knob {self.name!r}: give at most one of flag, env, placeholder (a placeholder "
                            "may have a flag only with flag_style = 'switch': the lone token {name} in the "
                            "command becomes the flag when true and nothing when false)")
        if self.kind is not None and self.kind not in KNOB_KINDS:
            raise SpecError(f"knob {self.name!r}: kind {self.kind!r} is unknown; expected one of {list(KNOB_KINDS)}")
        if self.flag_style not in FLAG_STYLES:
            raise SpecError(f"knob {self.name!r}: flag_style {self.flag_style!r} is unknown; "
                            f"expected one of {list(FLAG_STYLES)}")
        if self.flag_style == "switch" and not all(isinstance(v, bool) for v in self.values):
            raise SpecError(f"knob {self.name!r}: flag_style 'switch' needs boolean values, got {list(self.values)}")

    def canonical(self, value: Value) -> Value:
        """``value`` as the built-in priors spell it (``levels``), else unchanged."""
        return dict(self.levels).get(value, value)

    def index(self, value: Value) -> int:
        try:
            return self.values.index(value)
        except ValueError:
            raise SpecError(
                f"knob {self.name!r}: value {value!r} is not in its domain {list(self.values)}"
            ) from None


def _mixed(values: tuple[Value, ...]) -> bool:
    """Values numpy would coerce to one type (1 and "1", True and 1) stay python objects."""
    return len({type(v) for v in values}) > 1


_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
           ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod}
_CMPOPS = {ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt,
           ast.LtE: operator.le, ast.Gt: operator.gt, ast.GtE: operator.ge,
           ast.In: lambda a, b: np.isin(a, b), ast.NotIn: lambda a, b: ~np.isin(a, b)}


@dataclass(frozen=True)
class Constraint:
    """A boolean expression over knob names, e.g. ``"nproc * threads <= 2"`` or
    ``"not (compile == 'on' and checkpointing == 'selective')"``. Evaluated by a small
    whitelisting interpreter, never by ``eval``; numpy operators make the same code work
    on one config (scalars) and on whole columns of configs at once."""

    expr: str
    _tree: ast.Expression = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        try:
            tree = ast.parse(self.expr, mode="eval")
        except SyntaxError as exc:
            raise SpecError(f"constraint {self.expr!r}: not a valid expression ({exc.msg})") from None
        object.__setattr__(self, "_tree", tree)

    @property
    def names(self) -> set[str]:
        return {n.id for n in ast.walk(self._tree) if isinstance(n, ast.Name)}

    def holds(self, config: Mapping[str, Value]) -> bool:
        return bool(self._eval(self._tree.body, config))

    def mask(self, columns: Mapping[str, np.ndarray]) -> np.ndarray:
        """Whether the constraint holds, for every row of knob-value ``columns``."""
        num_rows = len(next(iter(columns.values())))
        return np.broadcast_to(np.asarray(self._eval(self._tree.body, columns), dtype=bool), (num_rows,))

    def _eval(self, node: ast.AST, env: Mapping[str, Any]) -> Any:
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            if node.id in ("True", "False"):
                return node.id == "True"
            return env[node.id]
        if isinstance(node, (ast.Tuple, ast.List)):
            return [self._eval(e, env) for e in node.elts]
        if isinstance(node, ast.BoolOp):
            combine = np.logical_and if isinstance(node.op, ast.And) else np.logical_or
            return functools.reduce(combine, (self._eval(v, env) for v in node.values))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.Not, ast.USub)):
            val = self._eval(node.operand, env)
            return np.logical_not(val) if isinstance(node.op, ast.Not) else -val
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            return _BINOPS[type(node.op)](self._eval(node.left, env), self._eval(node.right, env))
        if isinstance(node, ast.Compare) and all(type(op) in _CMPOPS for op in node.ops):
            left, out = self._eval(node.left, env), True
            for op, comp in zip(node.ops, node.comparators):
                right = self._eval(comp, env)
                out = np.logical_and(out, _CMPOPS[type(op)](left, right))
                left = right
            return out
        raise SpecError(f"constraint {self.expr!r}: unsupported syntax {type(node).__name__}")


@dataclass(frozen=True)
class KnobSpace:
    knobs: tuple[Knob, ...]
    constraints: tuple[Constraint, ...] = ()

    def __post_init__(self) -> None:
        names = [k.name for k in self.knobs]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise SpecError(f"knobs: names must be unique, {dupes} appear more than once")
        for c in self.constraints:
            unknown = c.names - set(names) - {"True", "False"}
            if unknown:
                raise SpecError(
                    f"constraint {c.expr!r}: unknown knob(s) {sorted(unknown)}; known knobs are {names}"
                )

    @property
    def names(self) -> list[str]:
        return [k.name for k in self.knobs]

    def knob(self, name: str) -> Knob:
        for k in self.knobs:
            if k.name == name:
                return k
        raise SpecError(f"unknown knob {name!r}; known knobs are {self.names}")

    @property
    def size(self) -> int:
        return math.prod(len(k.values) for k in self.knobs)

    def validate(self, config: Mapping[str, Value], *, what: str = "config") -> Config:
        """Return ``config`` as a complete dict or raise ``SpecError`` naming the problem."""
        unknown = set(config) - set(self.names)
        if unknown:
            raise SpecError(f"{what}: unknown knob(s) {sorted(unknown)}; known knobs are {self.names}")
        missing = [n for n in self.names if n not in config]
        if missing:
            raise SpecError(f"{what}: missing value for knob(s) {missing}")
        for k in self.knobs:
            if config[k.name] not in k.values:
                raise SpecError(f"{what}: knob {k.name!r}: value {config[k.name]!r} is not in its domain "
                                f"{list(k.values)}")
        return {n: config[n] for n in self.names}

    def violated(self, config: Mapping[str, Value]) -> list[str]:
        return [c.expr for c in self.constraints if not c.holds(config)]

    def is_feasible(self, config: Mapping[str, Value]) -> bool:
        return not self.violated(config)

    def key(self, config: Mapping[str, Value]) -> tuple[Value, ...]:
        return tuple(config[n] for n in self.names)

    def indices(self, config: Mapping[str, Value]) -> tuple[int, ...]:
        return tuple(k.index(config[k.name]) for k in self.knobs)

    def from_indices(self, idx: Iterable[int]) -> Config:
        return {k.name: k.values[i] for k, i in zip(self.knobs, idx)}

    def iter_all(self) -> Iterator[Config]:
        for combo in itertools.product(*(k.values for k in self.knobs)):
            yield dict(zip(self.names, combo))

    def index_grid(self) -> np.ndarray:
        """``[size, num_knobs]`` value indices of every config, in product order (last knob fastest)."""
        shape = [len(k.values) for k in self.knobs]
        return np.indices(shape).reshape(len(shape), -1).T

    def columns(self, idx: np.ndarray) -> dict[str, np.ndarray]:
        """Knob columns (values, not indices) for rows of value indices."""
        return {k.name: np.array(k.values, dtype=object if _mixed(k.values) else None)[idx[:, j]]
                for j, k in enumerate(self.knobs)}

    def feasible_mask(self, idx: np.ndarray) -> np.ndarray:
        cols = self.columns(idx)
        mask = np.ones(len(idx), dtype=bool)
        for c in self.constraints:
            mask &= c.mask(cols)
        return mask

    @cached_property
    def feasible_index_matrix(self) -> np.ndarray:
        """``[num_feasible, num_knobs]`` value indices of ``feasible``, for vectorised models."""
        idx = self.index_grid()
        return idx[self.feasible_mask(idx)]

    @cached_property
    def feasible(self) -> tuple[Config, ...]:
        """Every feasible config, in product order."""
        return tuple(self.from_indices(row) for row in self.feasible_index_matrix.tolist())

    def sample(self, rng: np.random.Generator, num_configs: int, *, exclude: Iterable[tuple] = ()) -> list[Config]:
        """Up to ``num_configs`` distinct feasible configs drawn uniformly, none in ``exclude``."""
        excluded = set(exclude)
        pool = [c for c in self.feasible if self.key(c) not in excluded]
        if not pool:
            return []
        picks = rng.choice(len(pool), size=min(num_configs, len(pool)), replace=False)
        return [dict(pool[i]) for i in picks]

    def neighbours(self, config: Mapping[str, Value]) -> list[Config]:
        """Feasible configs that differ from ``config`` in exactly one knob."""
        out = []
        for k in self.knobs:
            for v in k.values:
                if v != config[k.name]:
                    cand = dict(config)
                    cand[k.name] = v
                    if self.is_feasible(cand):
                        out.append(cand)
        return out


PATCH_KNOB_PREFIX = "patch_"


def patch_knob_name(patch_ref: str) -> str:
    """The boolean knob a code patch becomes: ``patch_<folder name>``, '-' as '_'."""
    return PATCH_KNOB_PREFIX + PurePosixPath(str(patch_ref).rstrip("/")).name.replace("-", "_")
