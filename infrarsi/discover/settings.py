"""A job's flags as its own parser sees them, where ``--help`` does not show them all.

- ``argparse_defaults``: the defaults of a plain argparse script, read from its source
  (``add_argument("--seed", type=int, default=1337)``): argparse's default help format
  lists a flag without its default, yet the flag is there all the same.
- ``python_settings``: a nanoGPT-style configurator's flags: the script's module-level
  settings (``batch_size = 12``), overridden by the ``.py`` config files the command gives,
  in order, each becoming a ``--key=value`` flag with its value.
- ``yaml_settings``: the keys of a YAML config file (torchtune's ``--config``), flattened to
  dotted ``key=value`` overrides.

Values are read, never executed: a constant, or arithmetic over constants (``5 * 8``);
anything else (``'bfloat16' if torch.cuda.is_available() else 'float16'``) is left out,
since its value depends on the machine the job runs on.
"""

from __future__ import annotations

import ast
import operator
from pathlib import Path
from typing import Any

from infrarsi.discover.command import Flag

_FOLD = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
         ast.FloorDiv: operator.floordiv, ast.Pow: operator.pow}
_UNREAD = object()


def _value(node: ast.AST) -> Any:
    """The value of a constant expression, else ``_UNREAD``."""
    if isinstance(node, ast.Constant) and isinstance(node.value, (bool, int, float, str)):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = _value(node.operand)
        return -inner if isinstance(inner, (int, float)) and not isinstance(inner, bool) else _UNREAD
    if isinstance(node, ast.BinOp) and type(node.op) in _FOLD:
        left, right = _value(node.left), _value(node.right)
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (left, right)):
            try:
                return _FOLD[type(node.op)](left, right)
            except (ArithmeticError, ValueError):
                return _UNREAD
    return _UNREAD


def _parse(path: Path) -> ast.Module | None:
    try:
        return ast.parse(Path(path).read_text(), filename=str(path))
    except (OSError, SyntaxError, ValueError):
        return None


def argparse_defaults(script: Path) -> dict[str, Any]:
    """``{normalised flag name: default}`` of every ``add_argument("--flag", ..., default=<constant>)``
    in ``script``; a ``store_true`` flag without a default defaults to False."""
    tree = _parse(script)
    out: dict[str, Any] = {}
    for node in ast.walk(tree) if tree else ():
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "add_argument"):
            continue
        names = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
        long = next((n for n in names if n.startswith("--")), None)
        if long is None:
            continue
        keywords = {k.arg: k.value for k in node.keywords if k.arg}
        value = _value(keywords["default"]) if "default" in keywords else _UNREAD
        if value is _UNREAD and "default" not in keywords and "action" in keywords:
            action = _value(keywords["action"])
            value = {"store_true": False, "store_false": True}.get(action, _UNREAD)
        if value is not _UNREAD:
            out[long.lstrip("-").replace("-", "_").lower()] = value
    return out


def _module_settings(path: Path) -> dict[str, Any]:
    tree = _parse(path)
    out: dict[str, Any] = {}
    for node in tree.body if tree else ():
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
            value = _value(node.value)
            if not name.startswith("_") and value is not _UNREAD:
                out[name] = value
            elif value is _UNREAD:
                out.pop(name, None)  # reassigned to something unread: its value is unknown
    return out


def python_settings(script: Path, config_files: list[Path]) -> list[Flag]:
    """The configurator's ``--key=value`` flags with the values the command's own config
    files leave them at (later files win)."""
    values = _module_settings(script)
    for config in config_files:
        values.update((k, v) for k, v in _module_settings(config).items() if k in values)
    return [Flag(name, f"--{name}", value, "equals", origin="the script's settings") for name, value in values.items()]


def yaml_settings(path: Path) -> list[Flag]:
    """The scalar keys of a YAML config as dotted ``key=value`` flags (``optimizer.lr=...``)."""
    import yaml

    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError):
        return []
    out: list[Flag] = []

    def walk(node: Any, prefix: str) -> None:
        for key, value in node.items():
            name = f"{prefix}{key}"
            if isinstance(value, dict):
                walk(value, name + ".")
            elif isinstance(value, (bool, int, float, str)):
                out.append(Flag(name, name, value, "equals", origin=f"its config file {Path(path).name}"))
    if isinstance(data, dict):
        walk(data, "")
    return out
