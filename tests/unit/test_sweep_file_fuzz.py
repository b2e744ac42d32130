"""Every key of a sweep file refuses bad values before anything starts: its table
(sweep_file.FIELDS) walked row by row, as test_validation_fuzz walks the train config's, with
invalid values drawn from each row's rule, written at the row's key into a valid sweep file and
run through the CLI's entry in-process with Ray, MLflow and the corpus replaced by sentinels."""

import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.cli import main
from orchestrator.core import sweep_file, table_reader
from orchestrator.core.sweep_schema import Sweep
from orchestrator.studies import kinds
from tests.conftest import TINY, write_sweep
from tests.unit.test_validation_fuzz import concrete, invalid


def test_every_key_of_the_file_has_one_rule():
    assert set(sweep_file.FIELDS) == set(table_reader.keys(Sweep))


SPECIAL = {  # rows that take several forms (their check says which): an invalid value of each
    "name": ["a/b", "..", ".hidden"],
    "base.config": [[1, 2], {"a": 1}],
    "base.overrides": ["tiny.yaml", 5, [1, 2]],
    "space": [
        {"optim.lrr": {"grid": [1e-3]}},
        {"optim.lr": {"normal": [0, 1]}},
        {"optim.lr": {"grid": []}},
        {"optim.lr": {"uniform": [0.1, 0.01]}},
        {"schedule.warmup_share": {"grid": ["5%"]}},
    ],
    "lr_scaling.base_lr": ["big", [1, 2], {"uniform": [1e-3]}, {"grid": [float("nan")]}],
    "lr_scaling.alpha": ["cubic", 5000, {"grid": [0.5, 3]}, {"beta": [1, 2]}],
    "constraints.*.key": ["optim.lrr"],
    "constraints.*.of": ["train.tokenz"],
    "search.optuna_storage": ["optuna.db", "redis://host"],
    "branch.at_tokens": [[0], [16384, 16384], [16384, 1.5]],
    "branch.factors": [[1, 1], [0, 1]],
    "branch.lr_scaling": ["cubic", 1000],
    "ladder.models": [[{}], [{"model.d_modl": 64}], [{"train.total_tokens": 8192}], ["model.d_model=64"]],
    "ladder.tokens_per_param": [[], [0], [1, 1], ["one"]],
    "ladder.rungs.*.overrides": [{}, "model.d_model=64", {"model.n_layer": 2}],
    "ladder.target.overrides": [{}, {"model.widht": 1}],
}

CONTEXT = {  # a valid section around the key under test, and what else it needs
    "base": ({"config": str(TINY)}, {}),
    "lr_scaling": ({"reference_tokens": 4096, "base_lr": 1e-3}, {"space": {"batch.tokens_per_update": 4096}}),
    "constraints": ([{"key": "schedule.warmup_tokens", "max": 0.1, "of": "train.total_tokens"}], {}),
    "branch": ({"at_tokens": [16384], "factors": [1, 2], "tokens": 16384}, {}),
    "ladder": (
        {"models": [{"model.d_model": 64}], "tokens_per_param": [1, 2], "target": {"params": 1.0e6, "tokens": 1.0e7}},
        {
            "search": {"algorithm": "bracket"},
            "space": {"batch.tokens_per_update": {"grid": [4096]}, "optim.lr": {"grid": [1e-3, 2e-3, 4e-3]}},
        },
    ),
    "ladder.rungs": ([{"overrides": {"model.d_model": 64}, "total_tokens": 65536}], {}),
    "ladder.target": ({"params": 1.0e6, "tokens": 1.0e7}, {}),
}


def sections(key: str, value) -> dict:
    """The sections of a sweep file that sets `key` (a row of the table) to `value`: each section
    on the way valid (CONTEXT), its list items by their first one."""
    parts = key.split(".")
    if len(parts) == 1:
        return {key: value}
    _, extra = CONTEXT.get(parts[0], ({}, {}))
    return {parts[0]: _nested(parts[0], parts[1:], value), **extra}


def _nested(prefix: str, rest: list, value):
    if not rest:
        return value
    section = CONTEXT.get(prefix, ({}, {}))[0]
    if rest[0] == "*":
        return [{**section[0], **_nested(prefix, rest[1:], value)}] if len(rest) > 1 else [value]
    inner = _nested(f"{prefix}.{rest[0]}", rest[1:], value)
    return {**section, rest[0]: inner} if isinstance(section, dict) else {rest[0]: inner}


def bad_values(key: str):
    rule = sweep_file.FIELDS[key]
    special = st.sampled_from(SPECIAL.get(key, [[1, 2]]))
    return special if rule.kind == "any" else st.one_of(invalid(rule, key), special)


KEYS = sorted(k for k, rule in sweep_file.FIELDS.items() if rule.kind != "any" or rule.check is not None)
"""Every row that refuses something (the description is prose: any value)."""


@pytest.mark.parametrize("key", KEYS)
@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_bad_value_is_exit_2_naming_the_key(key, data, nothing_starts, capsys):
    value = data.draw(bad_values(key), label="value")
    source = "branches.yaml" if key.startswith("branch.") else "smoke.yaml"
    path = write_sweep(nothing_starts.parent, source, **sections(key, value))
    assert main(["sweep", str(path)]) == 2, f"{key}={value!r}"
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and concrete(key) in err[0], err
    assert os.listdir(nothing_starts) == []


@pytest.mark.parametrize("head", sorted(h for h in CONTEXT if "." not in h))  # the others are inside `ladder`
def test_the_valid_sections_around_the_keys_are_valid(head, tmp_path):
    """The fuzz's control: each section it writes a bad value into passes as it stands."""
    section, extra = CONTEXT[head]
    source = "branches.yaml" if head == "branch" else "smoke.yaml"
    kinds.load(write_sweep(tmp_path, source, **{head: section, **extra}))
