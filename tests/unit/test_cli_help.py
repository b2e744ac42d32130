"""The command line explains itself: `--version`, and under every verb's --help a description
and examples that parse (every option an example uses exists) and name only shipped files."""

from __future__ import annotations

import importlib.metadata
import shlex

import pytest

from orchestrator import cli
from tests.conftest import ROOT


def _verbs():
    (action,) = [a for a in cli.build_parser()._actions if a.dest == "verb"]
    return action.choices


def test_version_is_the_package_version(capsys):
    with pytest.raises(SystemExit) as stop:
        cli.main(["--version"])
    assert stop.value.code == 0
    assert capsys.readouterr().out.strip() == f"orchestrator {importlib.metadata.version('lm-orchestrator')}"


def test_every_verb_has_examples():
    assert set(cli.EXAMPLES) == set(_verbs()), "one list of examples per verb"
    for name, parser in _verbs().items():
        text = parser.format_help()
        assert "examples:" in text and f"orchestrator {name}" in text.split("examples:")[1], name
        assert parser.description and parser.description != cli.__doc__.splitlines()[0], name


@pytest.mark.parametrize("verb,example", [(v, e) for v, lines in cli.EXAMPLES.items() for e in lines])
def test_each_example_parses_and_names_shipped_files(verb, example):
    words = shlex.split(example.split("  #")[0])
    args, extra = cli.build_parser().parse_known_args([verb, *words])
    assert args.verb == verb
    assert all("=" in e and not e.startswith("-") for e in extra), extra  # only overrides left over
    for word in words:
        if word.startswith("conf/"):
            assert (ROOT / word).is_file(), word


def test_a_misspelt_option_in_an_example_would_fail():
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["sweep", "conf/sweep/demo.yaml", "--dryrun"])
