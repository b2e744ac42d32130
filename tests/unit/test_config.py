"""Loading order, `extends`, the plan contract and the schema's documentation."""

import ast
import json
import math
from pathlib import Path

import pytest

from orchestrator.core import config, derived, schema
from orchestrator.core.errors import ConfigError
from orchestrator.driver import plan
from tests.conftest import ROOT, TINY


def test_loading_order_defaults_yaml_overrides(tmp_path):
    base = tmp_path / "base.yaml"
    base.write_text("optim:\n  lr: 0.5\n  weight_decay: 0.2\ntrain:\n  seed: 3\n")
    child = tmp_path / "child.yaml"
    child.write_text("extends: base.yaml\noptim:\n  lr: 0.25\n")
    cfg = config.load(child, ["train.seed=7"])
    assert cfg.optim.lr == 0.25  # child beats base
    assert cfg.optim.weight_decay == 0.2  # inherited from base
    assert cfg.train.seed == 7  # override beats both
    assert cfg.optim.beta1 == schema.OptimConfig().beta1  # schema default


def test_extends_cycle_is_an_error(tmp_path):
    (tmp_path / "a.yaml").write_text("extends: b.yaml\n")
    (tmp_path / "b.yaml").write_text("extends: a.yaml\n")
    with pytest.raises(ConfigError, match="cycle"):
        config.load(tmp_path / "a.yaml")


def test_shipped_configs_are_valid():
    for path in sorted((ROOT / "conf" / "train").glob("*.yaml")):
        cfg = config.load(path)
        info = plan.describe(cfg)
        assert (
            info["tokens_per_update"]
            == cfg.data.seq_len * info["micro_batch_size"] * info["num_workers"] * info["grad_accum_steps"]
        )


def test_design_example_through_plan():
    cfg = config.load(
        TINY,
        [
            "data.seq_len=4096",
            "model.max_seq_len=4096",
            "batch.micro_batch_size=4",
            "cluster.num_workers=128",
            "batch.tokens_per_update=16777216",
            "train.total_tokens=1000000000",
            "schedule.warmup_tokens=0",
        ],
    )
    info = plan.describe(cfg)
    assert info["grad_accum_steps"] == 8
    assert info["total_tokens"] == 59 * 16_777_216 and info["total_steps"] == 59
    assert info["deepspeed_train_batch_size"] == 4 * 128 * 8


def test_every_schema_field_has_a_docstring():
    """Each dataclass field is followed by a one-line string (Levanter style)."""
    tree = ast.parse(Path(schema.__file__).read_text())
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name.endswith("Config") and node.name != "Config":
            body = node.body
            for i, stmt in enumerate(body):
                if isinstance(stmt, ast.AnnAssign):
                    nxt = body[i + 1] if i + 1 < len(body) else None
                    assert isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant), (
                        f"{node.name}.{stmt.target.id} lacks a docstring"
                    )


@pytest.mark.parametrize("path", sorted((ROOT / "conf" / "train").glob("*.yaml")), ids=lambda p: p.stem)
def test_a_config_as_a_dict_is_omegaconfs_container_of_it(path):
    """to_dict reads the dataclass directly: the same keys, order, values and types as OmegaConf's
    container of the same config (data sources given, so lists of records are covered)."""
    from omegaconf import OmegaConf

    cfg = config.load(path, ["data.sources=[{name: sums, kind: arithmetic, weight: 1.0}]"])
    mine, omegaconf = config.to_dict(cfg, redact=False), OmegaConf.to_container(OmegaConf.structured(cfg))
    assert json.dumps(mine) == json.dumps(omegaconf)
    assert mine == omegaconf and config.from_dict(mine) == cfg


def test_env_values_are_redacted(monkeypatch):
    monkeypatch.setenv("TRACKING_SECRET", "hunter2")
    cfg = config.load(TINY, ["tracking.experiment=${oc.env:TRACKING_SECRET}"])
    assert cfg.tracking.experiment == "hunter2"  # the run itself sees the value
    text = json.dumps(config.flatten(config.to_dict(cfg))) + config.to_yaml(cfg)
    assert "hunter2" not in text and config.REDACTED in text


def test_a_password_inside_a_uri_appears_nowhere_it_is_logged_or_printed():
    """A literal `https://user:password@host` (not read from the environment) is redacted in the
    MLflow params, config.yaml and the printed UI command; the run itself still gets the URI."""
    from orchestrator.driver import run_life
    from orchestrator.tracking import mlflow_ui

    uri = "https://alice:hunter2@mlflow.example.com:5000"
    cfg = config.load(TINY, [f"tracking.uri={uri}", "data.sources.0.path=https://bob:s3cret@host/x.txt"])
    assert cfg.tracking.uri == uri and config.to_dict(cfg, redact=False)["tracking"]["uri"] == uri
    shown = json.dumps(run_life.run_params(cfg)) + config.to_yaml(cfg) + mlflow_ui.ui_command(uri)
    assert "hunter2" not in shown and "s3cret" not in shown
    assert "https://alice:***@mlflow.example.com:5000" in shown and "https://bob:***@host/x.txt" in shown


def test_the_workers_payload_carries_the_secret_pickled_but_never_prints_it(tmp_path, monkeypatch):
    """What Ray pickles for each worker (run_life.build_trainer's train_loop_config) is the frozen
    WorkerPayload: it survives pickling unchanged, holds the URI with its password (the worker
    logs to it), never shows the password in its repr (Ray's state and logs print it), and carries
    the test's fault injection as the command read it from its environment."""
    import dataclasses
    import pickle

    from orchestrator.driver import run_life
    from workloads.train import handoff

    monkeypatch.setenv(handoff.FAULT_ENV, "40")
    uri = "https://alice:hunter2@mlflow.example.com:5000"
    cfg = config.load(TINY, [f"tracking.uri={uri}"])
    trainer = run_life.build_trainer(
        cfg, "run-id", str(tmp_path), "payload", fault_at_tokens=run_life.injected_fault_at()
    )
    payload = handoff.payload_of(trainer.train_loop_config)
    assert pickle.loads(pickle.dumps(trainer.train_loop_config)) == {handoff.PAYLOAD_KEY: payload}
    assert payload.config["tracking"]["uri"] == uri and payload.run_id == "run-id"
    assert "hunter2" not in repr(payload) and "hunter2" not in str(trainer.train_loop_config)
    assert payload.fault == handoff.FaultInjection(at_tokens=40, marker=str(tmp_path / "payload" / ".fault_injected"))
    with pytest.raises(dataclasses.FrozenInstanceError):
        payload.run_id = "another"  # type: ignore[misc]


def test_warmup_within_one_update_names_the_smallest_valid_value():
    """An update's LR is the schedule after it: a warmup that ends within the first update would
    silently be no warmup at all. 0 stays valid; just over one update is the least that warms up."""
    for bad in (1000, 4096):
        with pytest.raises(
            ConfigError, match=rf"^schedule\.warmup_tokens: got {bad:,}; .* 0 \(no warmup\) or at least 4,097"
        ) as err:
            config.load(TINY, [f"schedule.warmup_tokens={bad}"])
        assert "\n" not in str(err.value)
    for valid in (0, 4097, 8192):
        assert config.load(TINY, [f"schedule.warmup_tokens={valid}"]).schedule.warmup_tokens == valid


@pytest.mark.parametrize(
    "override, key",
    [
        ("cluster.gpus_per_worker=0", "cluster.gpus_per_worker"),
        ("cluster.gpus_per_worker=2", "cluster.gpus_per_worker"),
        ("batch.micro_batch_size=0", "batch.micro_batch_size"),
        ("batch.micro_batch_size=big", "batch.micro_batch_size"),
        ("batch.micro_batch_size=true", "batch.micro_batch_size"),
    ],
)
def test_gpu_share_and_micro_batch_forms_are_checked(override, key):
    with pytest.raises(ConfigError, match=key):
        config.load(TINY, ["cluster.use_gpu=true", override])


def test_compile_defaults_to_the_device():
    assert not derived.compile_enabled(config.load(TINY))
    assert derived.compile_enabled(config.load(TINY, ["cluster.use_gpu=true"]))
    assert derived.compile_enabled(config.load(TINY, ["model.compile=true"]))


# ---------------------------------------------------------------- the split B_simple needs


def test_gns_splits_a_single_micro_batch_update_in_two():
    """tiny: 32 sequences per update. b = 32 would be one micro-batch; with gns.enabled and A
    omitted the solver takes b = 16, A = 2, and plan, the memory model and the MLflow params all
    show that; a given A = 1 is kept and plan says B_simple is then not measured."""
    from orchestrator.driver import run_life

    split = config.load(TINY, ["batch.micro_batch_size=32"])
    info = plan.describe(split)
    assert (info["micro_batch_size"], info["grad_accum_steps"]) == (16, 2)
    assert info["memory"]["activation_bytes"] == 16 * info["memory"]["activation_bytes_per_sequence"]
    assert "measured over D x A = 2" in info["gns"] and "split for it" in info["gns"]
    params = run_life.run_params(split)
    assert (params["batch.micro_batch_size"], params["batch.grad_accum_steps"]) == (16, 2)

    for kept in (["batch.grad_accum_steps=1"], ["gns.enabled=false"], ["train.loss_normalization=micro_batch"]):
        info = plan.describe(config.load(TINY, ["batch.micro_batch_size=32", *kept]))
        assert (info["micro_batch_size"], info["grad_accum_steps"]) == (32, 1), kept
    table = plan.format_table(
        plan.describe(config.load(TINY, ["batch.micro_batch_size=32", "batch.grad_accum_steps=1"]))
    )
    assert "not measured: batch.grad_accum_steps=1 given" in table


# ---------------------------------------------------------------- optimizer constants in tokens


def test_beta2_and_weight_decay_from_their_token_forms():
    """beta2 = 0.5 ** (B / N); weight decay = B / (lr x share x T); defaults when neither form is given."""
    from orchestrator.core import ds_config
    from orchestrator.driver import run_life

    default = config.load(TINY)
    assert default.optim.beta2 is None and default.optim.weight_decay is None
    assert derived.adamw_constants(default) == (0.95, 0.1)
    B, T, lr = 4096, 262144, 3e-3
    given = [
        f"batch.tokens_per_update={B}",
        f"train.total_tokens={T}",
        f"optim.lr={lr}",
        "optim.beta2_half_life_tokens=40960",
        "optim.weight_decay_timescale_share=0.5",
    ]
    cfg = config.load(TINY, given)
    beta2, weight_decay = derived.adamw_constants(cfg)
    assert beta2 == pytest.approx(0.5**0.1) and beta2**10 == pytest.approx(0.5)  # halves every 10 updates
    assert weight_decay == pytest.approx(B / (lr * 0.5 * T))
    assert (1 - lr * weight_decay) ** (T / B * 0.5) == pytest.approx(math.exp(-1), rel=0.02)  # e-fold in half the run
    params = ds_config.build(cfg, derived.batch_plan(cfg))["optimizer"]["params"]
    assert params["betas"][1] == beta2 and params["weight_decay"] == weight_decay
    logged = run_life.run_params(cfg)
    assert logged["optim.beta2_effective"] == beta2 and logged["optim.weight_decay_effective"] == weight_decay
    assert logged["optim.beta2"] is None, "what was given stays as given"
    table = plan.format_table(plan.describe(cfg))
    assert f"AdamW beta2                  {beta2:.6g}  (optim.beta2_half_life_tokens=40960)" in table
    assert derived.adamw_constants(config.load(TINY, ["optim.beta2=0.99", "optim.weight_decay=0"])) == (0.99, 0.0)

    # Along a batch.ramp they hold in tokens: at 4 B with the lr x 2 (sqrt), beta2 halves every
    # 2.5 updates and the weight decay doubles (4 B over 2 lr); `plan` prints each segment's.
    ramp = "batch.ramp=[{from_tokens: 0, tokens_per_update: 4096}, {from_tokens: 65536, tokens_per_update: 16384}]"
    ramped = config.load(TINY, [*given, ramp, "batch.ramp_lr_scaling=sqrt"])
    later = derived.batch_segments(ramped)[-1]
    assert derived.adamw_constants(ramped, later.plan.tokens_per_update, later.lr_factor) == (
        pytest.approx(0.5**0.4),
        pytest.approx(2 * weight_decay),
    )
    table = plan.format_table(plan.describe(ramped))
    (row,) = [line for line in table.splitlines() if line.startswith("ramp from 65,536 tokens")]
    assert row.endswith(f"after the change; beta2 {0.5**0.4:.6g}, weight decay {2 * weight_decay:.6g}"), row
    assert "after the change; beta2" not in plan.format_table(plan.describe(config.load(TINY, [ramp]))), (
        "per-step constants do not move: nothing to print"
    )


@pytest.mark.parametrize(
    "overrides, key, words",
    [
        (["optim.beta2=0.9", "optim.beta2_half_life_tokens=1000"], "optim.beta2_half_life_tokens", "one of the two"),
        (
            ["optim.weight_decay=0", "optim.weight_decay_timescale_share=0.5"],
            "optim.weight_decay_timescale_share",
            "one",
        ),
        (
            ["optim.lr=0", "optim.weight_decay_timescale_share=0.5"],
            "optim.weight_decay_timescale_share",
            "optim.lr > 0",
        ),
        (["optim.weight_decay_timescale_share=0.001"], "optim.weight_decay_timescale_share", "one update"),
        (["optim.beta2_half_life_tokens=1e300"], "optim.beta2_half_life_tokens", "rounds to 1"),
    ],
)
def test_optimizer_forms_are_checked(overrides, key, words):
    with pytest.raises(ConfigError) as err:
        config.load(TINY, overrides)
    assert err.value.key == key and words in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(
    "overrides, key, words",
    [
        (["optim.name=adam"], "optim.name", "one of adamw, sgd"),
        (["optim.name=sgd", "optim.beta1=0.8"], "optim.beta1", "default 0.9, or set optim.name=adamw"),
        (["optim.name=sgd", "optim.beta2=0.99"], "optim.beta2", "default null"),
        (["optim.name=sgd", "optim.beta2_half_life_tokens=40960"], "optim.beta2_half_life_tokens", "AdamW only"),
        (["optim.name=sgd", "optim.eps=1e-6"], "optim.eps", "default 1e-08"),
        (["optim.name=sgd", "optim.weight_decay_timescale_share=0.5"], "optim.weight_decay_timescale_share", "null"),
        (["optim.momentum=0.9"], "optim.momentum", "with optim.name=adamw, which does not use it (sgd only)"),
        (["optim.name=sgd", "optim.momentum=1"], "optim.momentum", "[0, 1)"),
    ],
)
def test_each_optimizer_refuses_the_others_keys(overrides, key, words):
    """An AdamW-only key away from its default with sgd, or momentum with adamw, would do nothing."""
    with pytest.raises(ConfigError) as err:
        config.load(TINY, overrides)
    assert err.value.key == key and words in str(err.value) and "\n" not in str(err.value), str(err.value)


def test_sgd_resolves_its_own_constants():
    """sgd: AdamW-only keys at their defaults (even given) pass; weight decay is coupled L2, 0 when
    null; plan prints SGD's constants and no AdamW ones; the DeepSpeed config allows the optimizer
    at ZeRO 1-3; adamw's sections stay as they were."""
    from orchestrator.core import ds_config

    cfg = config.load(TINY, ["optim.name=sgd", "optim.momentum=0.9", "optim.beta1=0.9", "deepspeed.zero_stage=2"])
    assert derived.sgd_weight_decay(cfg) == 0.0
    assert derived.sgd_weight_decay(config.load(TINY, ["optim.name=sgd", "optim.weight_decay=0.01"])) == 0.01
    table = plan.format_table(plan.describe(cfg))
    assert "SGD momentum                 0.9" in table and "SGD weight decay (L2)        0  (default)" in table
    assert "AdamW" not in table
    ds = ds_config.build(cfg, derived.batch_plan(cfg))
    assert ds["optimizer"] == {"type": "SGD", "params": {"lr": cfg.optim.lr, "momentum": 0.9, "weight_decay": 0.0}}
    assert ds["zero_allow_untested_optimizer"] is True
    adamw = config.load(TINY)
    assert adamw.optim.name == "adamw" and adamw.optim.momentum == 0.0
    ds = ds_config.build(adamw, derived.batch_plan(adamw))
    assert ds["optimizer"]["type"] == "AdamW" and "zero_allow_untested_optimizer" not in ds
    assert "AdamW beta2" in plan.format_table(plan.describe(adamw))


def test_fp16_is_refused_where_deepspeed_mistreats_it():
    """fp16 on CPU, and at ZeRO 0, where DeepSpeed 0.19.8 unscales gradients its backward never
    scaled (tests/unit/test_fp16_norms.py measures the factor); ZeRO 1 to 3 on a GPU pass."""
    gpu = ["cluster.use_gpu=true", "deepspeed.precision=fp16"]
    with pytest.raises(ConfigError, match="needs a GPU"):
        config.load(TINY, ["deepspeed.precision=fp16"])
    with pytest.raises(ConfigError, match="zero_stage=0") as refused:
        config.load(TINY, [*gpu, "deepspeed.zero_stage=0"])
    assert refused.value.key == "deepspeed.precision" and "bf16" in str(refused.value)
    for stage in (1, 2, 3):
        assert config.load(TINY, [*gpu, f"deepspeed.zero_stage={stage}"]).deepspeed.zero_stage == stage


def test_one_worker_runs_the_zero_stage_that_holds_the_least_memory():
    """With one worker ZeRO partitions nothing: of the stages up to the one given, the run takes
    the one with the fewest bytes per parameter (fp32: ZeRO 0 holds 16, ZeRO 1-3 hold 20; 16-bit:
    ZeRO 1 and 2 hold 16, ZeRO 0 and 3 hold 20; fp16 needs 1 or more). Two workers, a stage given
    to DeepSpeed in deepspeed.extra or an offload keep what was asked. DeepSpeed's config, the memory
    model, `plan` and the MLflow params all say the stage that runs."""
    from orchestrator.core import ds_config
    from orchestrator.driver import micro_batch, run_life
    from orchestrator.formulas import memory

    gpu = ["cluster.use_gpu=true"]
    expected = {  # (precision, given) -> the stage a one-worker run takes
        **{("fp32", given): 0 for given in range(4)},
        **{("bf16", 0): 0, ("bf16", 1): 1, ("bf16", 2): 1, ("bf16", 3): 1},
        **{("fp16", given): 1 for given in (1, 2, 3)},
    }
    for (precision, given), runs in expected.items():
        one = config.load(TINY, [*gpu, f"deepspeed.precision={precision}", f"deepspeed.zero_stage={given}"])
        assert derived.zero_stage(one) == runs, (precision, given)
        assert ds_config.build(one, derived.batch_plan(one))["zero_optimization"]["stage"] == runs
        two = config.load(
            TINY,
            [*gpu, f"deepspeed.precision={precision}", f"deepspeed.zero_stage={given}"] + ["cluster.num_workers=2"],
        )
        assert derived.zero_stage(two) == given
    asked = ["deepspeed.zero_stage=3", "batch.micro_batch_size=auto"]
    zero = "deepspeed.extra.zero_optimization"
    assert derived.zero_stage(config.load(TINY, [*asked, f"{zero}.stage=3"])) == 3
    assert derived.zero_stage(config.load(TINY, [*asked, f"{zero}.stage=1", "cluster.num_workers=2"])) == 1
    assert derived.zero_stage(config.load(TINY, [*asked, f"{zero}.offload_optimizer.device=cpu"])) == 3

    cfg = config.load(TINY, asked)
    estimate, costs = micro_batch.predict(cfg, 4)
    # fp32 ZeRO 0's, and gns/b_simple_adam's copy of AdamW's denominator; no bucket
    assert estimate.states == costs.params * (16 + 4) and estimate.bucket == 0
    assert estimate.total == memory.estimate(costs, 4, 0, "fp32", 1, adam_noise_scale=True).total
    for without in ("gns.adam=false", "gns.enabled=false"):
        assert micro_batch.predict(config.load(TINY, [*asked, without]), 4)[0].states == costs.params * 16, without
    info = plan.describe(cfg)
    assert (info["zero_stage"], info["zero_stage_given"]) == (0, 3)
    assert "0 (given 3; one worker" in plan.format_table(info)
    params = run_life.run_params(cfg)
    assert (params["deepspeed.zero_stage"], params["deepspeed.zero_stage_effective"]) == (3, 0)

    with pytest.raises(ConfigError, match="integer 0 to 3") as refused:
        config.load(TINY, [f"{zero}.stage=4"])
    assert refused.value.key == f"{zero}.stage"
    with pytest.raises(ConfigError, match="zero_stage=0"):
        config.load(TINY, [*gpu, "deepspeed.precision=fp16", "deepspeed.zero_stage=2", f"{zero}.stage=0"])


def test_a_config_error_raised_on_a_worker_reaches_the_driver_whole():
    """Ray pickles a worker's exception to the driver; ConfigError's two arguments survive it, and
    the run's failure reason is the worker's own 'Type: message', not Ray's traceback wrapper."""
    import pickle

    from ray.train import WorkerGroupError
    from ray.train.v2._internal.exceptions import UserExceptionWithTraceback

    from orchestrator.driver import run_life

    raised = ConfigError("checkpoint", "/runs/x/state/mp_rank_00_model_states.pt is not a checkpoint this tool wrote")
    back = pickle.loads(pickle.dumps(raised))
    assert (back.key, back.message, str(back)) == (raised.key, raised.message, str(raised))

    wrapped = UserExceptionWithTraceback(back, "Traceback (most recent call last):\n  File ...\nConfigError: ...")
    error = pickle.loads(pickle.dumps(WorkerGroupError("rank 1 failed", {1: wrapped, 0: RuntimeError("later")})))
    assert run_life.failure_cause(error) == "RuntimeError: later"  # the lowest rank
    error = WorkerGroupError("rank 1 failed", {1: wrapped})
    assert run_life.failure_cause(error) == f"ConfigError: {raised}"
    assert run_life.failure_cause(ValueError("plain")) == "ValueError: plain"


@pytest.mark.parametrize(
    "override, suggested",
    [
        ("optim.learning_rate=1e-3", "optim.lr"),  # an abbreviation: the initials of the words
        ("optim.lrr=1e-3", "optim.lr"),  # a typo
        ("optim.betas2=0.9", "optim.beta2"),
        ("batch.micro_batch=4", "batch.micro_batch_size"),
        ("train.total_token=65536", "train.total_tokens"),
        ("schedule.warmup=8192", "schedule.warmup_tokens"),
        ("train.warmup_tokens=8192", "schedule.warmup_tokens"),  # the right key in another section
    ],
)
def test_an_unknown_key_gets_the_key_it_was_meant_to_be(override, suggested):
    with pytest.raises(ConfigError) as info:
        config.load(TINY, [override])
    assert info.value.key == override.split("=")[0]
    assert str(info.value).endswith(f"did you mean {suggested}?"), str(info.value)


def test_the_gradient_buckets_of_a_model_with_an_odd_parameter_count_are_even():
    """The buckets are capped at the model's size, but ZeRO 1 and 2 refuse an odd one (DeepSpeed
    0.19.8 asserts a multiple of its all-gather alignment, 2): linear regression with d = 9."""
    from orchestrator.core import ds_config

    cfg = config.load(ROOT / "conf" / "train" / "linreg.yaml", ["model.dim=9"])
    zero = ds_config.build(cfg, derived.batch_plan(cfg), 9)["zero_optimization"]
    assert zero["reduce_bucket_size"] == zero["allgather_bucket_size"] == 10


LINREG = ROOT / "conf" / "train" / "linreg.yaml"  # 256 per update, 76,800 tokens: whole updates of 1,024
ADAPTIVE = ["batch.schedule=adaptive", "batch.max_tokens_per_update=1024"]


@pytest.mark.parametrize(
    "overrides, key, words",
    [
        (["batch.schedule=growing"], "batch.schedule", "one of fixed, adaptive"),
        (["batch.schedule=adaptive"], "batch.max_tokens_per_update", "a power of 2, e.g. 1,024"),
        (ADAPTIVE[:1] + ["batch.max_tokens_per_update=768"], "batch.max_tokens_per_update", "a power of 2"),
        (ADAPTIVE + ["train.total_tokens=76288"], "train.total_tokens", "use 75,776"),
        (ADAPTIVE + ["train.stop_at_tokens=512"], "train.stop_at_tokens", "use 1,024"),
        (ADAPTIVE + ["gns.enabled=false"], "batch.schedule", "gns.enabled=true"),
        (ADAPTIVE + ["batch.ramp=[{from_tokens: 0, tokens_per_update: 256}]"], "batch.ramp", "one or the other"),
        (ADAPTIVE + ["batch.calibration=0"], "batch.calibration", "> 0"),
        (["batch.max_tokens_per_update=1024"], "batch.max_tokens_per_update", "set batch.schedule=adaptive"),
        (["batch.calibration=2"], "batch.calibration", "set batch.schedule=adaptive"),
        (["batch.micro_batch_size=64", "batch.grad_accum_steps=4"] + ADAPTIVE, "batch.max_tokens_per_update", "512"),
    ],
)
def test_the_adaptive_schedule_is_checked(overrides, key, words):
    with pytest.raises(ConfigError) as err:
        config.load(LINREG, overrides)
    assert err.value.key == key and words in str(err.value) and "\n" not in str(err.value), str(err.value)


def test_an_adaptive_schedule_doubles_up_to_its_cap_with_the_calibration_given():
    cfg = config.load(LINREG, ADAPTIVE + ["batch.calibration=0.5", "train.stop_at_tokens=2048"])
    assert derived.adaptive_batches(cfg) == [512, 1024]
    assert derived.adaptive_rule(cfg) == derived.AdaptiveRule(max_tokens_per_update=1024, calibration=0.5)
    assert derived.adaptive_rule(config.load(LINREG)) is None


@pytest.mark.parametrize(
    "uri, shown",
    [
        ("ftp://audit:Pa@ss-w0rd@127.0.0.1:9/db", "ftp://audit:***@127.0.0.1:9/db"),  # '@' in the password
        ("https://me@corp.com:p:w@d@host/x", "https://me@corp.com:***@host/x"),  # the userinfo ends at the last '@'
        ("https://tok@en@host", "https://***@host"),
        (
            "mysql://u:p@ss@db:3306/x?a=1 then https://h/p?token=abc&x=1",
            "mysql://u:***@db:3306/x?a=1 then https://h/p?token=***&x=1",
        ),
        ("s3://bucket/key?X-Amz-Signature=f00d&sig=beef#frag", "s3://bucket/key?X-Amz-Signature=***&sig=***#frag"),
        ("https://host/a@b/c", "https://host/a@b/c"),  # an '@' in the path is no userinfo
    ],
)
def test_a_uri_is_redacted_whatever_its_password_holds(uri, shown):
    """urllib.parse's reading: the userinfo is everything before the authority's last '@'; tokens
    in a query string are secrets too."""
    from urllib.parse import urlsplit

    assert config.redact_uri(uri) == shown
    first = uri.split(" ")[0]
    if urlsplit(first).password:
        assert urlsplit(first).password not in config.redact_uri(uri)
