"""Every field refuses bad values before anything starts: the schema walked field by field, with
invalid values of each field's kind drawn by hypothesis, through the CLI's entry in-process with
Ray, MLflow and the corpus replaced by sentinels that fail the test when touched."""

import json
import math
import os
from dataclasses import fields, is_dataclass

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.cli import main
from orchestrator.core import config, derived, schema, storage, validation, yaml_files
from orchestrator.core.errors import ConfigError
from orchestrator.core.schema import RampStep, SourceConfig
from orchestrator.core.validation import FIELDS, Field
from orchestrator.driver import launch, ray_session, run_life
from orchestrator.tracking.store import Store
from tests.conftest import ROOT, TINY, run_cli, write_sweep
from workloads import workload


def leaf_keys(section=schema.Config, prefix=""):
    keys = set()
    for f in fields(section):
        default = f.default_factory() if callable(f.default_factory) else f.default
        if is_dataclass(default):
            keys |= leaf_keys(type(default), f"{prefix}{f.name}.")
        elif f.name == "sources":
            keys |= {f"{prefix}sources.*.{s.name}" for s in fields(SourceConfig)}
        elif f.name == "ramp":
            keys |= {f"{prefix}ramp.*.{s.name}" for s in fields(RampStep)}
        else:
            keys.add(f"{prefix}{f.name}")
    return keys


def test_every_schema_field_has_one_rule():
    assert set(FIELDS) == leaf_keys()


def dotlist(value) -> str:
    """A value as an OmegaConf override writes it."""
    if isinstance(value, str):
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    if isinstance(value, float) and math.isnan(value):
        return "nan"
    return repr(value).replace("True", "true").replace("False", "false") if not isinstance(value, list) else str(value)


SPECIAL = {  # fields that take several forms: an invalid value of each
    "model.name": ["not a path", "tests.nowhere:Workload", "tests.fixtures.user_workload:Missing"],
    "batch.micro_batch_size": ["automatic", 0, 1.5, True],
    "train.storage_path": ["ftp://host/runs", "http://host/runs"],
    "tracking.uri": ["ftp://nowhere/x", "s3://bucket/mlruns"],
    "model.init_from": ["/no/such/weights.safetensors"],
    "train.start_from_checkpoint": ["/no/such/checkpoint"],
    "train.stop_at_tokens": [1000, 10**9],
    "train.checkpoint_at_tokens": [[0], [-4096], [4096, 1.5]],  # no update of 4,096 tokens ends there; past the budget
    "data.tokenizer": ["/no/such/tokenizer.json", "byte"],
    "train.run_name": ["a/b", ".."],
    "cluster.address": ["5", "localhost", "http://head:8265"],
    "tracking.sinks": [["tests.nowhere:Sink"], ["not a path"], ["json:dumps", "json:dumps"], ["json:__name__"]],
}


def invalid(rule: Field, key: str):
    """A strategy of values the rule refuses, of the field's kind and of other kinds."""
    # (a number given to a text field is its text: OmegaConf converts it, and "5" may be a valid name)
    others = {"dict": [[1, 2], "abc", 5], "str": [[1, 2], {"a": 1}], "list": [{"a": 1}, "abc", 5]}
    wrong_kind = st.sampled_from(others.get(rule.kind, [[1, 2], {"a": 1}, "abc"]))
    options = [wrong_kind]
    if rule.kind in ("int", "float"):
        options.append(st.sampled_from([math.nan, math.inf, -math.inf]))
        if rule.low is not None:
            below = (
                st.integers(max_value=int(math.ceil(rule.low)) - 1)
                if rule.kind == "int"
                else st.floats(max_value=rule.low, exclude_max=not rule.low_open, allow_nan=False, allow_infinity=False)
            )
            options.append(below)
        if rule.high is not None:
            above = (
                st.integers(min_value=int(rule.high) + 1)
                if rule.kind == "int"
                else st.floats(
                    min_value=rule.high, exclude_min=not rule.high_open, allow_nan=False, allow_infinity=False
                )
            )
            options.append(above)
        if rule.kind == "int":
            options.append(st.floats(allow_nan=False, allow_infinity=False).filter(lambda x: not x.is_integer()))
    if rule.kind == "bool":
        options.append(st.sampled_from(["maybe", 2]))
    if rule.kind == "str":
        options.append(st.sampled_from(["", "   "]))
        if rule.choices is not None:
            options.append(st.text("abcxyz", min_size=1, max_size=8).filter(lambda v: v not in rule.choices()))
    if key in SPECIAL:
        options.append(st.sampled_from(SPECIAL[key]))
    return st.one_of(options)


def concrete(key: str) -> str:
    return key.replace(".*.", ".0.")


KEYS = sorted(FIELDS)


@pytest.mark.parametrize("key", KEYS)
@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_bad_value_is_exit_2_naming_the_field(key, data, nothing_starts, capsys):
    value = data.draw(invalid(FIELDS[key], key), label="value")
    override = f"{concrete(key)}={dotlist(value)}"
    extra = ["model.name=hf"] if key.startswith("model.hf.") else []  # read only for that workload
    if key.startswith("batch.ramp."):  # a ramp whose first step the override changes
        extra = ["batch.ramp=[{from_tokens: 0, tokens_per_update: 4096}]"]
    for verb in ("plan", "train"):
        code = main([verb, str(TINY), *extra, override])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2, f"{verb} {override}: exit {code}"
        assert len(err) == 1 and concrete(key) in err[0], f"{verb} {override}: {err}"
    assert os.listdir(nothing_starts) == [], "nothing written: no MLflow store, no run folder"


VALID_BOUNDARIES = [
    "optim.lr=0",  # measurement runs
    "optim.weight_decay=0",
    "optim.weight_decay=null",  # the default, 0.1
    "optim.beta2=0",
    "optim.beta2_half_life_tokens=1",  # beta2 = 0.5 ** 4096, 0: no memory
    "optim.weight_decay_timescale_share=1",
    "optim.weight_decay_timescale_share=0.015625",  # one update of the budget: lr x wd = 1
    "optim.grad_clip=0",
    "optim.beta1=0",
    "optim.momentum=0",
    "optim.name=sgd",
    "schedule.warmup_tokens=0",
    "schedule.min_lr_ratio=0",
    "schedule.min_lr_ratio=1",
    "schedule.wsd_decay_share=1",
    "train.checkpoint_every_tokens=0",
    "train.max_failures=0",
    "train.seed=0",
    "batch.micro_batch_size=1",
    "batch.micro_batch_size=auto",
    "cluster.num_workers=1",
    "cluster.cpus_per_worker=0.01",
    "cluster.gpus_per_worker=1",
    "data.max_documents_per_source=0",
    "data.eval_fraction=0.001",
    "model.noise_std=0",
    "model.vocab_size=257",
    "deepspeed.zero_stage=0",
    "deepspeed.zero_stage=3",
    "tracking.uri=mlruns",
    "tracking.uri=http://127.0.0.1:5000",
    "train.storage_path=s3://bucket/runs",
]


@pytest.mark.parametrize("override", VALID_BOUNDARIES)
def test_valid_boundary_values_pass(override, capsys):
    assert main(["plan", str(TINY), override]) == 0, capsys.readouterr().err


@pytest.mark.parametrize(
    "overrides, key",
    [
        (["optim.name=rmsprop"], "optim.name"),
        (["optim.name=sgd", "optim.beta2_half_life_tokens=4096"], "optim.beta2_half_life_tokens"),
        (["optim.momentum=0.9"], "optim.momentum"),
    ],
)
def test_an_optimizers_foreign_key_is_exit_2_naming_it(overrides, key, nothing_starts, capsys):
    for verb in ("plan", "train"):
        code = main([verb, str(TINY), *overrides])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1 and f"error: {key}: got " in err[0], (verb, err)
    assert os.listdir(nothing_starts) == []


@pytest.mark.parametrize(
    "args, key",
    [
        (["plan", str(TINY), "optim.lr=nan"], "optim.lr"),
        (["train", str(TINY), "optim.lr=inf"], "optim.lr"),
        (["plan", str(TINY), "tracking.uri=ftp://nowhere/x"], "tracking.uri"),
    ],
)
def test_no_traceback_through_the_real_command_line(args, key, tmp_path):
    code, out, err = run_cli(*args, cwd=tmp_path, timeout=120)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and key in lines[0] and "Traceback" not in err, err
    assert os.listdir(tmp_path) == []


def test_validation_reads_its_rules_from_one_table():
    cfg = config.load(TINY)
    assert dict(validation.values(cfg, "data.sources.*.weight")) == {
        f"data.sources.{i}.weight": s.weight for i, s in enumerate(cfg.data.sources)
    }


def test_ui_port_out_of_range_or_in_use_is_exit_2(tmp_path, capsys, monkeypatch):
    import socket

    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        main(["ui", "--port", "99999"])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.strip().count("\n") == 0
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        assert main(["ui", "--port", str(port), f"tracking.uri=sqlite:///{tmp_path}/ui.db"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--port" in err[0] and "in use" in err[0]
    assert not (tmp_path / "ui.db").exists(), "no store created for a server that cannot start"


# ---------------------------------------------------------------- sweep files (their table: test_sweep_file_fuzz.py)

NAN, INF = math.nan, math.inf
SPACE = {"batch.tokens_per_update": {"grid": [2048, 4096]}}
MALFORMED = [  # (sections, what the one line names)
    ({"space": {**SPACE, "optim.lr": {"uniform": [NAN, 1.0]}}}, "space.optim.lr"),
    ({"space": {**SPACE, "optim.lr": {"loguniform": [0.0, 1.0]}}}, "space.optim.lr"),
    ({"space": {**SPACE, "optim.lr": {"uniform": [2.0, 1.0]}}}, "space.optim.lr"),
    ({"space": {**SPACE, "optim.lr": {"uniform": [1.0]}}}, "space.optim.lr"),
    ({"space": {**SPACE, "optim.lr": {"grid": []}}}, "space.optim.lr"),
    ({"space": {**SPACE, "optim.lr": {"beta": [1, 2]}}}, "space.optim.lr"),
    ({"space": {**SPACE, "optim.lrr": {"grid": [1e-3]}}}, "space.optim.lrr"),
    ({"space": {**SPACE, "optim.lr": {"grid": [INF]}}}, "optim.lr"),
    ({"space": {**SPACE, "schedule.warmup_share": {"grid": [NAN]}}}, "space.schedule.warmup_share"),
    ({"constraints": [{"key": "schedule.warmup_tokens", "max": NAN, "of": "train.total_tokens"}]}, "constraints.0.max"),
    ({"constraints": [{"key": "schedule.warmup_tokens", "min": INF}]}, "constraints.0.min"),
    ({"constraints": [{"key": "nope", "max": 0.1}]}, "constraints.0.key"),
    ({"constraints": [{"max": 0.1}]}, "constraints.0"),
    ({"constraints": "warmup below a tenth"}, "constraints"),
    ({"space": SPACE, "lr_scaling": {"reference_tokens": 0, "base_lr": 1e-3}}, "lr_scaling.reference_tokens"),
    ({"space": SPACE, "lr_scaling": {"reference_tokens": INF, "base_lr": 1e-3}}, "lr_scaling.reference_tokens"),
    ({"space": SPACE, "lr_scaling": {"reference_tokens": 4096, "base_lr": NAN}}, "lr_scaling.base_lr"),
    ({"space": SPACE, "lr_scaling": {"reference_tokens": 4096, "base_lr": 1e-3, "alpha": "cube"}}, "lr_scaling.alpha"),
    ({"space": SPACE, "lr_scaling": {"reference_tokens": 4096, "base_lr": 1e-3, "alpha": NAN}}, "lr_scaling.alpha"),
    ({"space": SPACE, "lr_scaling": {"base_lr": 1e-3}}, "lr_scaling"),
]


@settings(max_examples=2 * len(MALFORMED), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=st.sampled_from(MALFORMED))
def test_a_malformed_space_constraint_or_lr_rule_is_exit_2_naming_it(case, nothing_starts, capsys):
    sections, names = case
    path = write_sweep(nothing_starts.parent, **sections)
    assert main(["sweep", str(path)]) == 2, sections
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and names in err[0], (sections, err)
    assert os.listdir(nothing_starts) == []


SMOKE = ROOT / "conf" / "sweep" / "smoke.yaml"


@pytest.mark.parametrize(
    "args, key",
    [
        (["plan", str(TINY), "--device-memory", "9e999"], "--device-memory"),
        (["plan", str(TINY), "batch.micro_batch_size=auto", "--device-memory", "1MiB"], "batch.micro_batch_size"),
        (
            ["sweep", str(SMOKE), "--dry-run", "--device-memory", "1MiB", "batch.micro_batch_size=auto"],
            "space: no trial would start",
        ),
        (["plan", str(TINY), "cluster.gpus_per_worker=0.5"], "cluster.gpus_per_worker"),
        (["plan", str(TINY), "model.name=tests.fixtures.raises_at_import:Workload"], "model.name"),
        (["jobs", "status", "../../api/version", "--address", "http://127.0.0.1:1"], "JOB_ID"),
        (["jobs", "list", "--address", "http://[::1"], "--address"),
        (["jobs", "list", "--address", "http://127.0.0.1:99999"], "--address"),
        (["prepare", str(TINY), "--out", "OUT", "--train-tokenizer", "2147483648"], "--train-tokenizer"),
        (["train", str(TINY), "train.storage_path=AFILE"], "train.storage_path"),  # was a RUNNING run left behind
        (["report", "it's", "tracking.uri=STORE"], "SWEEP_OR_RUN"),
        (["report", 'it\'s "both"', "tracking.uri=STORE"], "SWEEP_OR_RUN"),
        (["export", "some-run", "--out", "OUT", "--checkpoint", "ftp://host/runs/x"], "--checkpoint"),
        (["train", str(TINY), "train.storage_path=ftp://host/runs"], "train.storage_path"),
    ],
)
def test_inputs_that_used_to_crash_are_exit_2_in_one_line(args, key, nothing_starts, tmp_path, capsys):
    """Each of these raised a traceback (OverflowError, ValueError, an unescaped MLflow filter, an
    abort from a 141 GB allocation, a module raising at import) or was accepted although it does
    nothing; now: exit 2, one line naming what is wrong, nothing written."""
    store = tmp_path / "store" / "mlflow.db"
    if "tracking.uri=STORE" in args:  # report needs a store to look the name up in
        store.parent.mkdir()
        Store(f"sqlite:///{store}", "orchestrator").ensure_experiment()
        capsys.readouterr()
    (tmp_path / "a-file").write_text("not a folder")
    args = [a.replace("OUT", str(tmp_path / "out")).replace("STORE", f"sqlite:///{store}") for a in args]
    args = [a.replace("AFILE", str(tmp_path / "a-file")) for a in args]
    code = main(args)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and key in err[0], err
    assert not (tmp_path / "out").exists()
    assert os.listdir(nothing_starts) == []


@pytest.mark.parametrize(
    "shape, what",
    [(["model.d_model=32"], "the model's ["), (["model.n_layers=1"], "missing ['blocks.1.")],
)
def test_init_from_of_another_shape_is_exit_2_before_anything_is_created(shape, what, tmp_path, monkeypatch, capsys):
    """Checked against the model built on the meta device, before Ray, MLflow or a run folder:
    it used to fail in the worker a minute in, after a FAILED run and runs/<name>/ were created."""
    from safetensors.torch import save_model

    from workloads.builtin import gpt

    other = config.load(TINY, shape)
    save_model(gpt.GPT(gpt.GPTConfig.of(other.model)), str(tmp_path / "other.safetensors"))
    monkeypatch.setattr(ray_session, "ray_init", lambda *a, **k: pytest.fail("Ray started"))
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    code = main(["train", str(TINY), f"model.init_from={tmp_path / 'other.safetensors'}", "train.storage_path=runs"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err[-1].startswith("orchestrator train: error: model.init_from: "), err
    assert "do not match the model" in err[-1] and what in err[-1], err
    assert sorted(p.name for p in work.iterdir() if p.name != ".cache") == [], "nothing but the token cache"


def test_the_same_shape_passes_the_init_from_check(tmp_path):
    """The check's negative control: the model's own weights, tied head stored once, match."""
    from orchestrator.export import export
    from workloads.builtin import gpt

    model = gpt.GPT(gpt.GPTConfig.of(config.load(TINY).model))
    assert model.lm_head.weight is model.wte.weight
    export.save_safetensors(model.state_dict(), tmp_path / "own.safetensors")
    cfg = config.load(TINY, [f"model.init_from={tmp_path / 'own.safetensors'}"])
    workload.preflight(cfg, derived.batch_plan(cfg))


def test_train_resume_finds_the_newest_unfinished_run_of_the_same_config(tmp_path, monkeypatch, capsys):
    """A run started without train.run_name and killed: `train --resume` names it from the run
    records (same config, MLflow run not FINISHED, newest first); with none, exit 2 before Ray."""
    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    overrides = [f"tracking.uri={uri}", "train.storage_path=runs"]
    cfg = config.load(TINY, overrides)
    run_life.resolve_paths(cfg)
    digest = run_life.config_digest(cfg)
    other = config.load(TINY, [*overrides, "optim.lr=0.5"])
    run_life.resolve_paths(other)
    Store(uri, cfg.tracking.experiment).ensure_experiment()
    for name, started, status, of in [
        ("old-killed", 1, "RUNNING", digest),
        ("newer-finished", 2, "FINISHED", digest),
        ("newest-other-config", 4, "RUNNING", run_life.config_digest(other)),
        ("new-killed", 3, "RUNNING", digest),
    ]:
        run_id = Store(uri, cfg.tracking.experiment).create_run(name)
        if status == "FINISHED":
            Store(uri).finish_run(run_id, status)
        record = {"mlflow_run_id": run_id, "config_digest": of, "started": started}
        storage.write_json(storage.join(cfg.train.storage_path, name, launch.RUN_RECORD), record)
    assert launch.unfinished_run(cfg, digest) == "new-killed"

    monkeypatch.setattr(ray_session, "ray_init", lambda *a, **k: pytest.fail("Ray started"))
    code = main(["train", str(TINY), *overrides, "optim.lr=0.25", "--resume"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err[-1].startswith("orchestrator train: error: --resume: no unfinished run of this config"), (
        err
    )
    code = main(["train", str(TINY), *overrides, "train.run_name=never-ran", "--resume"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and "no run named 'never-ran'" in err[-1], err


BAD_OF_KIND = {
    "int": [-1, 1.5, "abc", None],
    "float": [math.nan, -1.0, "abc", None],
    "bool": [2, "maybe", None],
    "str": ["", [1, 2], 5, None],
}


def variant_cases():
    """(key, value): every scalar field once with a value of its kind it may refuse, and the
    valid boundaries above."""
    cases = []
    for i, key in enumerate(k for k in KEYS if ".*." not in k):
        bad = BAD_OF_KIND.get(FIELDS[key].kind, [[1, 2], "abc"])
        cases.append((key, bad[i % len(bad)]))
    for override in VALID_BOUNDARIES:
        key, value = yaml_files.parse_overrides([override])[0]
        cases.append((key, value))
    return cases


def outcome(load, *args):
    """The config as JSON (so 0 and 0.0 differ), or the error's text."""
    try:
        return json.dumps(config.to_dict(load(*args), redact=False), sort_keys=True, default=str)
    except ConfigError as exc:
        return str(exc)


def test_a_sweeps_fast_load_of_a_variant_is_the_full_load(monkeypatch):
    """config.load_variant (a sweep resolves each trial by it: the base merged once, each scalar
    converted by its schema node) gives what config.load gives, a config or an error alike; the
    valid values take the fast way (they load with config.load out of reach)."""
    for key, value in variant_cases():
        fast = outcome(config.load_variant, TINY, [], {key: value})
        full = outcome(config.load, TINY, yaml_files.dotlist({key: value}))
        assert fast == full, (key, value)
    monkeypatch.setattr(config, "load", lambda *args, **kwargs: pytest.fail("load_variant fell back to load"))
    for override in VALID_BOUNDARIES:
        config.load_variant(TINY, [], dict(yaml_files.parse_overrides([override])))
