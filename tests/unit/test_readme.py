"""README.md and docs/*.md against the code they describe, in process and in a few seconds.

Every line of a fenced block that runs the tool (`orchestrator ...`, `.venv/bin/orchestrator ...`,
`python -m orchestrator ...`, `make ...`) must name a verb of `orchestrator.cli.build_parser()`,
only options of that verb (read from its argparse actions, so an abbreviation argparse would
accept still fails), files that exist when they point into the repository, real config keys in
the overrides of `train` and `plan`, and real Makefile targets and variables; the line must also
parse as `orchestrator.cli.main` parses it. The README's verbs table lists every verb and every
option of the parser, `.ci/run` runs the README's test command, every relative link of the README
and of docs/ resolves, and the README stays at most 200 lines. No subprocess, no Ray: a README
that drifts from the code fails here, not in a reader's shell."""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import shlex
from pathlib import Path
from typing import Dict, List, Set

import pytest

from orchestrator import cli
from orchestrator.core.config import schema_keys

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
MAX_LINES = 200  # "a README that fits on a screen or two"; the manual is docs/
FENCE = re.compile(r"^```([\w-]*)[^\n]*\n(.*?)^```", re.M | re.S)
LINK = re.compile(r"\]\(([^)\s]+)\)")
REPO_PATH = re.compile(r"^(conf|docs|tests|deploy|benchmarks|orchestrator|workloads)/")
# A sweep's, a report's or the UI's overrides may also name sweep-file keys or reach a run's
# params: only train and plan take nothing but train-config keys.
CONFIG_VERBS = {"train", "plan"}
# The verbs table's rows: a first cell that is one code span starting with `orchestrator VERB`.
TABLE_ROW = re.compile(r"^\| `orchestrator (\w+)([^`]*)` \|", re.M)
OPTION = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")


# ---------------------------------------------------------------- reading the documents


def command_lines(text: str) -> List[List[str]]:
    """The tool's command lines in the fenced blocks of a Markdown text, as shell words (comments
    and backslash continuations handled as the shell does). In a `console` block only the lines
    after a `$ ` prompt are commands (the rest is output); `python` blocks are code, not shell."""
    lines = []
    for lang, body in FENCE.findall(text):
        if lang == "python":
            continue
        body = body.replace("\\\n", " ")
        for line in body.splitlines():
            if lang == "console":
                if not line.startswith("$ "):
                    continue
                line = line[2:]
            try:
                words = shlex.split(line, comments=True)
            except ValueError:  # an unbalanced quote: output or prose, not a command
                continue
            while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", words[0]):  # VAR=value before a command
                words = words[1:]
            if tool_args(words) is not None or (words and words[0] == "make"):
                lines.append(words)
    return lines


def tool_args(words: List[str]):
    """The arguments after `orchestrator` (or a path to it such as .venv/bin/orchestrator, or
    `python -m orchestrator`), else None. Not `orchestrator/`: that is the package in a file tree."""
    if words and (words[0] == "orchestrator" or words[0].endswith("/bin/orchestrator")):
        return words[1:]
    if len(words) >= 3 and Path(words[0]).name.startswith("python") and words[1:3] == ["-m", "orchestrator"]:
        return words[3:]
    return None


def makefile_targets_and_variables() -> tuple:
    text = (ROOT / "Makefile").read_text()
    targets: Set[str] = set()
    for match in re.finditer(r"^([A-Za-z0-9_.$()/ -]+?)\s*:(?![=])", text, re.M):
        targets.update(t for t in match.group(1).split() if not t.startswith((".", "$")))
    variables = set(re.findall(r"^([A-Z_][A-Z0-9_]*)\s*[?:+]?=", text, re.M))
    return targets, variables


def subparsers() -> Dict[str, argparse.ArgumentParser]:
    parser = cli.build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def options_of(sub: argparse.ArgumentParser) -> Set[str]:
    """Every option string of a verb but --help, read from its argparse actions."""
    return {s for a in sub._actions if not isinstance(a, argparse._HelpAction) for s in a.option_strings}


def is_config_key(key: str, keys: Set[str]) -> bool:
    """A schema key, or an element of one that holds a list or a mapping (data.sources.0.weight,
    model.hf.extra.num_key_value_heads)."""
    return key in keys or any(key.startswith(k + ".") for k in keys)


# ---------------------------------------------------------------- the checks


def check_command(words: List[str]) -> List[str]:
    """What is wrong with one command line (empty: nothing)."""
    line = shlex.join(words)
    if words[0] == "make":
        targets, variables = makefile_targets_and_variables()
        errors = []
        for word in words[1:]:
            if "=" in word:
                name = word.split("=", 1)[0]
                if name not in variables:
                    errors.append(f"{line}: the Makefile has no variable {name}")
            elif not word.startswith("-") and word not in targets:
                errors.append(f"{line}: the Makefile has no target {word!r} ({', '.join(sorted(targets))})")
        return errors
    args = tool_args(words)
    verbs = subparsers()
    if not args or args[0] not in verbs:
        verb = args[0] if args else "(none)"
        return [f"{line}: {verb!r} is not a verb of orchestrator.cli.build_parser() ({', '.join(verbs)})"]
    verb, rest = args[0], args[1:]
    errors = []
    allowed = options_of(verbs[verb])
    for word in rest:
        if word.startswith("-") and not re.fullmatch(r"-\d[\d.e+-]*", word):  # not a negative number
            option = word.split("=", 1)[0]
            if option not in allowed:
                valid = ", ".join(sorted(allowed))
                errors.append(f"{line}: {option} is not an option of `orchestrator {verb}` ({valid})")
        elif REPO_PATH.match(word) and "=" not in word and not (ROOT / word).exists():
            errors.append(f"{line}: {word} does not exist in the repository")
    if verb in CONFIG_VERBS:
        keys = set(schema_keys())
        for word in rest:
            if "=" in word and not word.startswith("-"):
                key = word.split("=", 1)[0]
                if not is_config_key(key, keys):
                    errors.append(f"{line}: {key} is not a config key (orchestrator.core.config.schema_keys())")
    if not errors:  # the same parse as orchestrator.cli.main, which would refuse the line with exit 2
        errors += parse_errors(line, args)
    return errors


def parse_errors(line: str, args: List[str]) -> List[str]:
    parser = cli.build_parser()
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
        try:
            parsed, extra = parser.parse_known_args(args)
            if extra and not (hasattr(parsed, "overrides") and all("=" in e and not e.startswith("-") for e in extra)):
                parser.error(f"unrecognized arguments: {' '.join(extra)}")
            if parsed.verb == "sweep":
                cli._check_sweep_args(parser, parsed)
        except SystemExit:
            return [f"{line}: argparse refuses it: {stderr.getvalue().strip()}"]
    return []


def check_commands(text: str) -> List[str]:
    return [error for words in command_lines(text) for error in check_command(words)]


def broken_links(path: Path, text: str) -> List[str]:
    """Relative links (`](target)`, images included) whose file does not exist; anchors ignored."""
    broken = []
    for target in LINK.findall(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):  # http:, mailto:, an anchor
            continue
        file = target.split("#", 1)[0]
        if not (path.parent / file).exists():
            broken.append(f"{path.relative_to(ROOT)}: {target}")
    return broken


def table_errors(text: str) -> List[str]:
    """The verbs table against the parser: every verb has a row, and the rows of a verb name
    exactly its options."""
    named: Dict[str, Set[str]] = {}
    for verb, rest in TABLE_ROW.findall(text):
        named.setdefault(verb, set()).update(OPTION.findall(rest))
    errors = []
    for verb, sub in subparsers().items():
        if verb not in named:
            errors.append(f"the verbs table has no row for `orchestrator {verb}`")
            continue
        missing, unknown = options_of(sub) - named[verb], named[verb] - options_of(sub)
        errors += [f"the verbs table's `orchestrator {verb}` lacks {o}" for o in sorted(missing)]
        errors += [f"the verbs table's `orchestrator {verb}` names {o}, not an option of it" for o in sorted(unknown)]
    errors += [f"the verbs table names `orchestrator {v}`, not a verb" for v in sorted(set(named) - set(subparsers()))]
    return errors


# ---------------------------------------------------------------- the tests


def test_readme_fits_on_a_screen_or_two():
    lines = len(README.read_text().splitlines())
    assert lines <= MAX_LINES, f"README.md has {lines} lines, over {MAX_LINES}: move the detail into a docs/ page"


@pytest.mark.parametrize("path", [README, *DOCS], ids=lambda p: str(p.relative_to(ROOT)))
def test_fenced_commands_name_real_verbs_options_files_keys_and_targets(path):
    assert not check_commands(path.read_text())


def test_readme_runs_the_tool_and_both_make_commands():
    lines = command_lines(README.read_text())
    assert ["make", "demo"] in lines and ["make", "test"] in lines
    assert {tool_args(w)[0] for w in lines if tool_args(w)} >= {"sweep", "report", "ui", "plan"}


def test_ci_runs_exactly_the_readme_test_command():
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    commands = [line for line in ci if line and not line.startswith("#") and not line.startswith(("set ", "cd "))]
    assert commands == ["make test"], commands
    assert ["make", "test"] in command_lines(README.read_text())


def test_verbs_table_lists_every_verb_and_option_of_the_parser():
    assert not table_errors(README.read_text())


@pytest.mark.parametrize("path", [README, *DOCS], ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(path):
    assert not broken_links(path, path.read_text())


# ---------------------------------------------------------------- the checks catch what they should


GOOD = """
```bash
make demo
make setup TORCH_INDEX=https://download.pytorch.org/whl/cu128
.venv/bin/orchestrator report conf/sweep/demo.yaml --target-loss 2.6 --target-loss 2.75   # a comment
python -m orchestrator plan conf/train/tiny.yaml data.sources.0.weight=2 --json
```

```console
$ orchestrator sweep conf/sweep/demo.yaml \\
    --dry-run --mfu 0.4
sweep 'demo': output, not a command: orchestrator nonsense --nope
```

```python
orchestrator = "python code, not a command line"
```
"""


@pytest.mark.parametrize(
    "line, says",
    [
        ("orchestrator sweeep conf/sweep/demo.yaml", "'sweeep' is not a verb"),
        ("orchestrator report conf/sweep/demo.yaml --target-losses 2.7", "--target-losses is not an option"),
        # argparse alone would take --target for --target-loss: a README should spell options out
        ("orchestrator report conf/sweep/demo.yaml --target 2.7", "--target is not an option"),
        ("orchestrator plan conf/train/nope.yaml", "conf/train/nope.yaml does not exist"),
        ("orchestrator train conf/train/tiny.yaml optim.lrr=1e-3", "optim.lrr is not a config key"),
        ("orchestrator submit conf/sweep/demo.yaml --follow", "the following arguments are required: --address"),
        ("orchestrator sweep conf/sweep/demo.yaml --mfu 0.4", "--mfu only with --dry-run"),
        ("make demoo", "no target 'demoo'"),
        ("make setup TORCH_IDX=cu128", "no variable TORCH_IDX"),
    ],
)
def test_a_wrong_command_is_caught(line, says):
    assert not check_commands(GOOD), check_commands(GOOD)
    assert len(command_lines(GOOD)) == 5  # the output line and the python block are not commands
    errors = check_commands(GOOD + f"\n```bash\n{line}\n```\n")
    assert len(errors) == 1 and says in errors[0], errors


def test_a_missing_verb_or_option_in_the_table_is_caught():
    table = README.read_text()
    assert not table_errors(table)
    assert "lacks --target-loss" in " ".join(table_errors(table.replace(" [--target-loss L]", "")))
    row = next(line for line in table.splitlines() if line.startswith("| `orchestrator jobs "))
    assert "no row for `orchestrator jobs`" in " ".join(table_errors(table.replace(row, "")))
    assert "--verbose, not an option" in " ".join(table_errors(table.replace("[--json]", "[--json] [--verbose]")))


def test_a_broken_link_is_caught():
    text = "[ok](docs/design.md#2-layering) [web](https://ray.io) [anchor](#quickstart) ![gone](docs/images/gone.png)"
    assert broken_links(README, text) == ["README.md: docs/images/gone.png"]
