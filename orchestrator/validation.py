"""Cross-field checks of a loaded config that the types alone cannot express.

Imports only the schema (orchestrator.config) and the pure arithmetic; `config.load` calls
`validate` through a lazy import, so there is no import cycle.
"""

from __future__ import annotations

from orchestrator import batching, schedules
from orchestrator.config import AUTO, Config, batch_plan
from orchestrator.errors import ConfigError
from orchestrator.feasibility import STRATEGIES as PLACEMENT_STRATEGIES
from workloads import registry as workload_registry  # names only: the standard library, no torch

SOURCE_KINDS = ("code", "prose", "arithmetic", "files", "hf")
PRECISIONS = ("fp32", "bf16", "fp16")
STORAGE_SCHEMES = ("s3", "gs", "gcs", "file", "hdfs", "abfs", "abfss")  # what pyarrow.fs opens


def _positive(key: str, value: float, allow_zero: bool = False) -> None:
    if value < 0 or (value == 0 and not allow_zero):
        raise ConfigError(key, f"got {value}; must be {'>= 0' if allow_zero else '> 0'}")


def _choice(key: str, value: str, valid: tuple) -> None:
    if value not in valid:
        raise ConfigError(key, f"got {value!r}; valid: {', '.join(valid)}")


def _check_workload_name(name: str) -> None:
    """A registered name (the table that builds them), or `package.module:factory` that imports."""
    names = workload_registry.names()
    if name in names:
        return
    valid = f"valid: {', '.join(names)} or package.module:factory"
    if not workload_registry.is_import_path(name):
        raise ConfigError("model.name", f"got {name!r}; {valid}")
    try:
        factory = workload_registry.factory(name)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(
            "model.name", f"got {name!r}; it does not import ({type(exc).__name__}: {exc}); {valid}"
        ) from None
    if not callable(factory):
        raise ConfigError("model.name", f"got {name!r}; that is a {type(factory).__name__}, not a workload factory")


def validate(cfg: Config) -> None:
    """Cross-field checks the types alone cannot express. Raises ConfigError."""
    m, d, t = cfg.model, cfg.data, cfg.train
    _check_workload_name(m.name)
    for key in ("n_layers", "n_heads", "d_model", "mlp_ratio", "max_seq_len", "vocab_size", "dim"):
        _positive(f"model.{key}", getattr(m, key))
    if m.d_model % m.n_heads:
        raise ConfigError("model.n_heads", f"got {m.n_heads}; must divide model.d_model={m.d_model}")
    _positive("model.noise_std", m.noise_std, allow_zero=True)
    _positive("model.w_star_norm", m.w_star_norm, allow_zero=True)
    _positive("data.seq_len", d.seq_len)
    if m.name in ("gpt", "hf") and d.seq_len > m.max_seq_len:
        raise ConfigError(
            "data.seq_len",
            f"got {d.seq_len}; beyond model.max_seq_len={m.max_seq_len} positions; "
            f"use <= {m.max_seq_len} or raise model.max_seq_len",
        )
    if not d.sources:
        raise ConfigError("data.sources", "empty; name at least one source")
    names = [src.name for src in d.sources]
    for i, src in enumerate(d.sources):
        if src.name in names[:i]:
            raise ConfigError(
                f"data.sources.{i}.name",
                f"{src.name!r} is also data.sources.{names.index(src.name)}.name; "
                "each source needs its own name (it labels data/share/<name>)",
            )
        _choice(f"data.sources.{i}.kind", src.kind, SOURCE_KINDS)
        _positive(f"data.sources.{i}.weight", src.weight)
        if src.kind in ("files", "hf") and not src.path:
            raise ConfigError(f"data.sources.{i}.path", f"missing; a `{src.kind}` source needs a local path")
    if not 0 < d.eval_fraction < 1:
        raise ConfigError("data.eval_fraction", f"got {d.eval_fraction}; must be strictly between 0 and 1")
    _positive("data.max_documents_per_source", d.max_documents_per_source, allow_zero=True)
    _positive("cluster.num_workers", cfg.cluster.num_workers)
    _positive("cluster.cpus_per_worker", cfg.cluster.cpus_per_worker)
    _choice("cluster.placement_strategy", cfg.cluster.placement_strategy, PLACEMENT_STRATEGIES)
    scheme = t.storage_path.partition("://")[0] if "://" in t.storage_path else None
    if not t.storage_path or (scheme is not None and scheme not in STORAGE_SCHEMES):
        raise ConfigError(
            "train.storage_path",
            f"got {t.storage_path!r}; use a path or a URI with scheme " + ", ".join(f"{s}://" for s in STORAGE_SCHEMES),
        )
    _positive("optim.lr", cfg.optim.lr, allow_zero=True)
    _positive("optim.weight_decay", cfg.optim.weight_decay, allow_zero=True)
    _positive("optim.grad_clip", cfg.optim.grad_clip, allow_zero=True)
    for key in ("beta1", "beta2"):
        if not 0 <= getattr(cfg.optim, key) < 1:
            raise ConfigError(f"optim.{key}", f"got {getattr(cfg.optim, key)}; must be in [0, 1)")
    s = cfg.schedule
    _choice("schedule.decay", s.decay, schedules.DECAYS)
    _positive("schedule.warmup_tokens", s.warmup_tokens, allow_zero=True)
    if not 0 <= s.min_lr_ratio <= 1:
        raise ConfigError("schedule.min_lr_ratio", f"got {s.min_lr_ratio}; must be in [0, 1]")
    if not 0 < s.wsd_decay_share <= 1:
        raise ConfigError("schedule.wsd_decay_share", f"got {s.wsd_decay_share}; must be in (0, 1]")
    for key in ("total_tokens", "report_every_tokens", "eval_every_tokens", "eval_tokens", "keep_checkpoints"):
        _positive(f"train.{key}", getattr(t, key))
    _positive("train.checkpoint_every_tokens", t.checkpoint_every_tokens, allow_zero=True)
    _positive("train.max_failures", t.max_failures, allow_zero=True)
    _choice("train.loss_normalization", t.loss_normalization, ("token", "micro_batch"))
    b = cfg.batch.micro_batch_size
    if b != AUTO and (isinstance(b, bool) or not isinstance(b, int) or b < 1):
        raise ConfigError("batch.micro_batch_size", f"got {b!r}; must be a positive integer or {AUTO!r}")
    if cfg.cluster.use_gpu and not 0 < cfg.cluster.gpus_per_worker <= 1:
        raise ConfigError(
            "cluster.gpus_per_worker",
            f"got {cfg.cluster.gpus_per_worker}; must be in (0, 1]: a worker uses one device, a fraction shares it",
        )
    plan = batch_plan(cfg)
    batching.total_steps(plan, t.total_tokens)
    if s.warmup_tokens > t.total_tokens:
        raise ConfigError(
            "schedule.warmup_tokens",
            f"got {s.warmup_tokens:,}; longer than the budget train.total_tokens={t.total_tokens:,}",
        )
    if 0 < s.warmup_tokens <= plan.tokens_per_update:
        # An update's LR is the schedule at the tokens seen after it: the first would get the peak.
        tpu = plan.tokens_per_update
        raise ConfigError(
            "schedule.warmup_tokens",
            f"got {s.warmup_tokens:,}; not more than one update ({tpu:,} tokens), so no update "
            f"would warm up; use 0 (no warmup) or at least {tpu + 1:,} "
            f"(e.g. {2 * tpu:,}: the first update at half the peak)",
        )
    ds = cfg.deepspeed
    if ds.zero_stage not in (0, 1, 2, 3):
        raise ConfigError("deepspeed.zero_stage", f"got {ds.zero_stage}; valid: 0, 1, 2, 3")
    _choice("deepspeed.precision", ds.precision, PRECISIONS)
    if m.name == "hf":
        from workloads.hf_model import hf_config  # transformers: only for hf models

        hf_config(cfg)
    if ds.precision == "fp16" and not cfg.cluster.use_gpu:
        raise ConfigError(
            "deepspeed.precision", "got 'fp16'; fp16 needs a GPU (cluster.use_gpu=true); on CPU use fp32 or bf16"
        )
    _positive("tracking.flush_every_s", cfg.tracking.flush_every_s)
    _positive("tracking.max_buffered_points", cfg.tracking.max_buffered_points)
    _positive("tracking.system_metrics_interval_s", cfg.tracking.system_metrics_interval_s)
    if cfg.gns.ema_tokens is not None:
        _positive("gns.ema_tokens", cfg.gns.ema_tokens)
