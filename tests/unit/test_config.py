"""Loading order, `extends`, the plan contract and the schema's documentation."""

import ast
import json
from pathlib import Path

import pytest

from orchestrator import config, plan, schema
from orchestrator.errors import ConfigError
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
    assert cfg.optim.beta1 == config.OptimConfig().beta1  # schema default


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


def test_env_values_are_redacted(monkeypatch):
    monkeypatch.setenv("TRACKING_SECRET", "hunter2")
    cfg = config.load(TINY, ["tracking.experiment=${oc.env:TRACKING_SECRET}"])
    assert cfg.tracking.experiment == "hunter2"  # the run itself sees the value
    text = json.dumps(config.flatten(config.to_dict(cfg))) + config.to_yaml(cfg)
    assert "hunter2" not in text and config.REDACTED in text


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
    assert not config.compile_enabled(config.load(TINY))
    assert config.compile_enabled(config.load(TINY, ["cluster.use_gpu=true"]))
    assert config.compile_enabled(config.load(TINY, ["model.compile=true"]))
