"""The docs cannot drift from the command line: every `infrarsi ...` example in README.md and
docs/ parses with the real parser (a flag it names exists, a choice it gives is allowed),
each subcommand's `--help` runs, and the README's `init` example runs (without its dry
run). `report --json` of a finished folder is tests/test_console.py's."""

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from infrarsi.cli.main import _parser, main

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# What the docs write for a value the reader fills in, as a value that parses.
FILLERS = {"DIR": "some-dir", "SPEC": "campaign.toml", "[SPEC]": "campaign.toml", "HEAD:6379": "10.0.0.1:6379",
           "CAMPAIGN_ID": "some-id", "URI": "sqlite:///x.db"}


def examples() -> list[tuple[str, str]]:
    """(page, command) for every `infrarsi ...` in inline code or at the start of a code line."""
    found = []
    for page in PAGES:
        text = page.read_text()
        commands = re.findall(r"`(infrarsi (?:campaign|init|report|compare|bank)\b[^`]*)`", text)
        commands += re.findall(r"^\s*(infrarsi (?:campaign|init|report|compare|bank)\b.*?)(?:\s+#.*)?$", text, re.M)
        found += [(page.name, c.strip()) for c in commands]
    return sorted(set(found))


def _argv(command: str) -> list[str]:
    command = command.split(" | ")[0]  # `infrarsi campaign --json | jq .`
    argv = []
    for token in shlex.split(command)[1:]:
        if "|" in token and not token.startswith("-"):  # list|show|forget: each alternative is checked below
            token = token.split("|")[0]
        token = re.sub(r"<[^>]+>", "x", token)
        argv.append(FILLERS.get(token, token.replace("mlflow+URI", "mlflow+sqlite:///x.db")))
    return argv


def test_the_docs_hold_examples_of_every_subcommand():
    named = {c.split()[1] for _, c in examples()}
    assert {"campaign", "init", "report", "compare", "bank"} <= named


def _parses(argv: list[str]) -> bool:
    try:
        _parser().parse_args(argv)
    except SystemExit as exc:
        return exc.code == 0  # `--help` exits 0
    return True


@pytest.mark.parametrize("page,command", examples())
def test_every_documented_command_parses(page, command):
    argv = _argv(command)
    # prose that names a subcommand (`infrarsi bank`) or one of its options (`infrarsi compare
    # --tracking-uri`): the subcommand exists and, given a value, so does the option
    named = argv == ["bank"] and _parses(["bank", "list"]) or argv[-1].startswith("--") and _parses(argv + ["x"])
    assert _parses(argv) or named, f"{page}: `{command}` does not parse with the infrarsi command line"


@pytest.mark.parametrize("sub", ["campaign", "init", "report", "compare", "bank", "bank list"])
def test_each_subcommands_help_runs(sub):
    done = subprocess.run([sys.executable, "-m", "infrarsi.cli", *sub.split(), "--help"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0 and "usage: infrarsi" in done.stdout, done.stderr


def test_the_readmes_init_example_writes_a_spec(tmp_path, monkeypatch, capsys):
    line = next(c for page, c in examples() if page == "README.md" and c.startswith("infrarsi init --"))
    (tmp_path / "train.py").write_text("import argparse\np = argparse.ArgumentParser()\n"
                                       "p.add_argument('--batch_size', type=int, default=12)\n"
                                       "p.add_argument('--gradient_accumulation_steps', type=int, default=1)\n"
                                       "p.add_argument('--max_iters', type=int, default=100)\np.parse_args()\n")
    monkeypatch.chdir(tmp_path)
    argv = _argv(line)
    assert main([argv[0], "--no-dry-run", *argv[1:]]) == 0
    assert "wrote" in capsys.readouterr().out and (tmp_path / "campaign.toml").is_file()

