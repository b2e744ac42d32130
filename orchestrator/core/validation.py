"""Every check of a loaded config, run by every verb that loads one, before Ray, MLflow or any
file write: first each field against its rule in FIELDS (one row per schema key, the one place
its valid values are declared), then the checks that span fields.

Floats must be finite everywhere (no field takes NaN or infinity). Pure: the schema, what it
implies (derived) and the arithmetic; `config.load` calls `validate`.
"""

from __future__ import annotations

import ipaddress
import math
import re
from collections import Counter
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Callable, Iterator, List, Optional, Tuple

from orchestrator.core import storage, workload_paths
from orchestrator.core.derived import (
    ADAPTIVE,
    adamw_constants,
    adaptive_batches,
    batch_plan,
    batch_segments,
    zero_extra,
    zero_stage,
)
from orchestrator.core.errors import ConfigError
from orchestrator.core.schema import ADAMW_ONLY_KEYS, AUTO, OPTIMIZERS, ClusterConfig, Config, OptimConfig
from orchestrator.formulas import batching, schedules
from orchestrator.formulas.feasibility import STRATEGIES as PLACEMENT_STRATEGIES

SOURCE_KINDS = ("code", "prose", "arithmetic", "files", "hf")
PRECISIONS = ("fp32", "bf16", "fp16")
STORAGE_SCHEMES = ("s3", "gs", "gcs", "file", "hdfs", "abfs", "abfss")  # what pyarrow.fs opens
TRACKING_SCHEMES = ("sqlite", "file", "http", "https", "postgresql", "mysql", "mssql", "databricks", "databricks-uc")
"""What MLflow's tracking stores accept (a plain path is a file store)."""


@dataclass(frozen=True)
class Field:
    """The values one config key takes."""

    kind: str
    """int, float, bool, str, dict, list, or any (a value of several forms: its check says which)."""
    low: Optional[float] = None
    """Smallest valid value (excluded when low_open)."""
    high: Optional[float] = None
    """Largest valid value (excluded when high_open)."""
    low_open: bool = False
    high_open: bool = False
    choices: Optional[Callable[[], Tuple[Any, ...]]] = None
    """The valid values, when they are a list (a function: the workload names grow at run time)."""
    optional: bool = False
    """None (YAML null) is valid."""
    also: Tuple[str, ...] = ()
    """Words accepted besides the kind (e.g. `auto`)."""
    check: Optional[Callable[[str, Any], None]] = None
    """A further check of the form (a URI's scheme, an import path); raises ConfigError."""
    what: str = ""
    """The valid values in words, where the kind alone says too little (a mapping of what to what)."""

    def describe(self) -> str:
        if self.choices is not None:
            return "one of " + ", ".join(map(str, self.choices()))
        what = {"int": "an integer", "float": "a finite number", "bool": "true or false"}.get(self.kind, "")
        what = what or {"str": "non-empty text", "dict": "a mapping", "list": "a list", "any": "a value"}[self.kind]
        what = self.what or what
        if self.low is not None and self.high is not None:
            left, right = "(" if self.low_open else "[", ")" if self.high_open else "]"
            what += f" in {left}{_num(self.low)}, {_num(self.high)}{right}"
        elif self.low is not None:
            what += f" {'>' if self.low_open else '>='} {_num(self.low)}"
        elif self.high is not None:
            what += f" {'<' if self.high_open else '<='} {_num(self.high)}"
        return what + "".join(f" or {word!r}" for word in self.also) + (" or null" if self.optional else "")

    def validate(self, key: str, value: Any) -> None:
        if value is None and self.optional or value in self.also:
            return
        if not self._fits(value):
            raise ConfigError(key, f"got {value!r}; must be {self.describe()}")
        if self.check is not None:
            self.check(key, value)

    def _fits(self, value: Any) -> bool:
        if self.kind == "any":
            return True
        if self.kind == "bool" or isinstance(value, bool):
            return self.kind == "bool" and isinstance(value, bool)
        if self.kind in ("int", "float"):
            if not isinstance(value, (int, float)) or (self.kind == "int" and not isinstance(value, int)):
                return False
            return math.isfinite(value) and self._in_range(value)
        if self.kind in ("dict", "list"):
            return isinstance(value, dict if self.kind == "dict" else list)
        if not isinstance(value, str) or not value.strip():
            return False
        return self.choices is None or value in self.choices()

    def _in_range(self, x: float) -> bool:
        above = self.low is None or (x > self.low if self.low_open else x >= self.low)
        return above and (self.high is None or (x < self.high if self.high_open else x <= self.high))


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def count(low: int = 1, **kw: Any) -> Field:
    return Field("int", low=low, **kw)


def number(low: Optional[float] = None, high: Optional[float] = None, **kw: Any) -> Field:
    return Field("float", low=low, high=high, **kw)


def one_of(*values: Any) -> Field:
    return Field("str", choices=lambda: values)


def _workload_name(key: str, name: str) -> None:
    """A registered name (the table that builds them), or `package.module:factory` that imports."""
    names = workload_paths.names()
    if name in names:
        return
    valid = f"valid: {', '.join(names)} or package.module:factory"
    if not workload_paths.is_import_path(name):
        raise ConfigError(key, f"got {name!r}; {valid}")
    _callable_at(key, name, workload_paths.factory, valid, "a workload factory")


def _callable_at(key: str, path: str, load: Callable[[str], Any], valid: str, what: str) -> None:
    """`path` (package.module:attribute) imports, by `load`, to something callable (`what`)."""
    try:
        found = load(path)
    except Exception as exc:  # the user's module may raise anything while it imports
        raise ConfigError(key, f"got {path!r}; it does not import ({type(exc).__name__}: {exc}); {valid}") from None
    if not callable(found):
        raise ConfigError(key, f"got {path!r}; that is a {type(found).__name__}, not {what}")


def _sinks(key: str, paths: List[Any]) -> None:
    """Each an import path that imports, to a class or factory, and named once: a sink is built
    from it in every process that writes a run (a worker too), so one that cannot be built must
    be refused here, before the sweep's first run exists."""
    valid = "valid: a list of package.module:Attribute, each a tracking sink class or factory, named once"
    for path in paths:
        if not isinstance(path, str) or not workload_paths.is_import_path(path) or paths.count(path) > 1:
            raise ConfigError(key, f"got {path!r}; {valid}")
        _callable_at(key, path, workload_paths.load, valid, "a sink class or factory")


def _scheme(valid: Tuple[str, ...], what: str) -> Callable[[str, Any], None]:
    """A path, or a URI whose scheme is one of `valid`."""

    def check(key: str, value: str) -> None:
        scheme = value.partition("://")[0].lower() if "://" in value else None
        if scheme is not None and scheme not in valid:
            raise ConfigError(key, f"got {value!r}; use a path or {what} " + ", ".join(f"{s}://" for s in valid))

    return check


def _exists(key: str, value: str) -> None:
    """A file or folder on this machine (model.init_from: its loader opens local paths only)."""
    if "://" in value or not Path(value).expanduser().exists():
        raise ConfigError(key, f"got {value!r}; no such file or folder here (a local path, not a URI)")


def token_counts(key: str, value: List[Any]) -> None:
    """A list of distinct whole numbers >= 1 (token counts, batch factors): a repeat would run or
    keep the same thing twice."""
    if not all(isinstance(t, int) and not isinstance(t, bool) and t >= 1 for t in value):
        raise ConfigError(key, f"got {value!r}; must be a list of token counts >= 1")
    repeated = [t for t, n in Counter(value).items() if n > 1]
    if repeated:
        raise ConfigError(key, f"got {value!r}; {repeated[0]:,} is there more than once: give each once")


def _ray_address(key: str, value: str) -> None:
    if not re.fullmatch(r"auto|local|(ray://)?[\w.\-\[\]:]+:\d{1,5}", value):
        raise ConfigError(key, f"got {value!r}; use auto, host:port or ray://host:port (Ray's address)")


def loopback(host: str) -> bool:
    """localhost, 127.0.0.0/8 or ::1: traffic that never leaves this machine (where the Ray token
    goes without asking, where the MLflow UI binds without a warning)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def plain_name(key: str, value: str) -> None:
    """The project's one rule for a name that becomes a folder (a source's under `prepare --out`
    and the token cache, a run's under train.storage_path, a sweep's under runs/sweeps/ and
    reports/): one plain path component, so it cannot reach outside."""
    if value.startswith(".") or any(c in value for c in "/\\\0"):
        raise ConfigError(key, f"got {value!r}; a plain name (no '/', '\\' or NUL, not starting with '.')")


def storage_location(key: str, value: str) -> None:
    """A URI pyarrow opens, or a local path that is (or will be) a folder: checked before any
    MLflow run, run record or folder is created."""
    _scheme(STORAGE_SCHEMES, "a URI with scheme")(key, value)
    local = value[len("file://") :] if value.startswith("file://") else value
    if "://" not in local and Path(local).expanduser().is_file():
        raise ConfigError(key, f"got {value!r}, which is a file; give a folder (new or existing) or a URI")


BATCH_SCHEDULES = ("fixed", ADAPTIVE)

LR_SCALING = number(0, 2, also=tuple(batching.ALPHA_WORDS))
"""An lr scaling exponent alpha (lr x (B / B_ref) ** alpha: batch.ramp_lr_scaling, a sweep's
lr_scaling.alpha and branch.lr_scaling): sqrt, linear or a number in [0, 2]: past 2 it only
overflows, and below 0 a larger batch would take a smaller lr (-1e308 overflowed too)."""

FIELDS = {
    "model.name": Field("str", check=_workload_name),
    "model.n_layers": count(),
    "model.n_heads": count(),
    "model.d_model": count(),
    "model.mlp_ratio": count(),
    "model.max_seq_len": count(),
    "model.vocab_size": count(optional=True),
    "model.compile": Field("bool", optional=True),
    "model.hf.architecture": Field("str"),
    "model.hf.extra": Field("dict"),
    "model.init_from": Field("str", optional=True, check=_exists),
    "model.dim": count(),
    "model.noise_std": number(0),
    "model.w_star_norm": number(0),
    "data.seq_len": count(),
    "data.tokenizer": Field("str"),
    "data.sources.*.name": Field("str", check=plain_name),
    "data.sources.*.kind": one_of(*SOURCE_KINDS),
    "data.sources.*.path": Field("str", optional=True),
    "data.sources.*.weight": number(0, low_open=True),
    "data.sources.*.text_field": Field("str"),
    "data.sources.*.split": Field("str"),
    "data.eval_fraction": number(0, 1, low_open=True, high_open=True),
    "data.max_documents_per_source": count(0),
    "data.shard_dir": Field("str", optional=True),
    # a ramp's first batch size is batch.tokens_per_update too: checked first, named as given
    "batch.ramp.*.from_tokens": count(0),
    "batch.ramp.*.tokens_per_update": count(high=batching.MAX_TOKENS_PER_UPDATE),
    "batch.tokens_per_update": count(high=batching.MAX_TOKENS_PER_UPDATE),
    "batch.micro_batch_size": count(also=(AUTO,)),
    "batch.grad_accum_steps": count(optional=True),
    "batch.ramp_lr_scaling": LR_SCALING,
    "batch.schedule": one_of(*BATCH_SCHEDULES),
    "batch.max_tokens_per_update": count(optional=True, high=batching.MAX_TOKENS_PER_UPDATE),
    "batch.calibration": number(0, low_open=True),
    "batch.calibration_from": Field("str", optional=True, check=plain_name),
    "cluster.num_workers": count(),
    "cluster.address": Field("str", optional=True, check=_ray_address),
    "cluster.cpus_per_worker": number(0, low_open=True),
    "cluster.use_gpu": Field("bool"),
    "cluster.gpus_per_worker": number(0, 1, low_open=True),
    "cluster.placement_strategy": one_of(*PLACEMENT_STRATEGIES),
    "optim.lr": number(0),
    "optim.weight_decay": number(0, optional=True),
    "optim.weight_decay_timescale_share": number(0, low_open=True, optional=True),
    "optim.beta1": number(0, 1, high_open=True),
    "optim.beta2": number(0, 1, high_open=True, optional=True),
    "optim.beta2_half_life_tokens": number(0, low_open=True, optional=True),
    "optim.eps": number(0, low_open=True),
    "optim.grad_clip": number(0),
    "optim.name": one_of(*OPTIMIZERS),
    "optim.momentum": number(0, 1, high_open=True),
    "schedule.warmup_tokens": count(0),
    "schedule.decay": one_of(*schedules.DECAYS),
    "schedule.min_lr_ratio": number(0, 1),
    "schedule.wsd_decay_share": number(0, 1, low_open=True),
    "train.total_tokens": count(high=batching.MAX_TOTAL_TOKENS),
    "train.seed": count(0),
    "train.report_every_tokens": count(),
    "train.eval_every_tokens": count(),
    "train.eval_tokens": count(),
    "train.checkpoint_every_tokens": count(0),
    "train.keep_checkpoints": count(),
    "train.run_name": Field("str", optional=True, check=plain_name),
    "train.storage_path": Field("str", check=storage_location),
    "train.max_failures": count(0),
    "train.loss_normalization": one_of("token", "micro_batch"),
    "train.start_from_checkpoint": Field("str", optional=True, check=storage.checkpoint_folder),
    "train.stop_at_tokens": count(optional=True),
    "train.checkpoint_at_tokens": Field("list", check=token_counts),
    "deepspeed.zero_stage": Field("int", low=0, high=3),
    "deepspeed.precision": one_of(*PRECISIONS),
    "deepspeed.extra": Field("dict"),
    "tracking.uri": Field("str", check=_scheme(TRACKING_SCHEMES, "an MLflow store URI:")),
    "tracking.experiment": Field("str"),
    "tracking.flush_every_s": number(0, low_open=True),
    "tracking.max_buffered_points": count(),
    "tracking.system_metrics": Field("bool", optional=True),
    "tracking.system_metrics_interval_s": number(0, low_open=True),
    "tracking.sinks": Field("list", check=_sinks),
    "gns.enabled": Field("bool"),
    "gns.adam": Field("bool"),
    "gns.ema_tokens": count(optional=True),
}
"""One rule per leaf of the schema (`*`: every item of a list); a test keeps it complete."""


def values(cfg: Config, key: str) -> Iterator[Tuple[str, Any]]:
    """(full key, value) of a FIELDS key in cfg: one pair, or one per list item for `*`."""
    head, star, tail = key.partition(".*.")
    node: Any = cfg
    for part in head.split("."):
        node = getattr(node, part)
    if not star:
        yield key, node
        return
    for i, item in enumerate(node or []):
        yield f"{head}.{i}.{tail}", getattr(item, tail)


def check_override(key: str, value: Any) -> None:
    """Before OmegaConf converts an override: a number given to a true/false field is refused
    (OmegaConf would read 2 as true)."""
    rule = FIELDS.get(re.sub(r"\.\d+\.", ".*.", key))
    if rule is not None and rule.kind == "bool" and not isinstance(value, bool) and value is not None:
        raise ConfigError(key, f"got {value!r}; must be {rule.describe()}")


def validate(cfg: Config) -> None:
    """Each field against its rule, then the checks across fields. Raises ConfigError."""
    for key, rule in FIELDS.items():
        for full_key, value in values(cfg, key):
            rule.validate(full_key, value)
    _across_fields(cfg)


def _across_fields(cfg: Config) -> None:
    m, d, t, s = cfg.model, cfg.data, cfg.train, cfg.schedule
    if not cfg.cluster.use_gpu and cfg.cluster.gpus_per_worker != ClusterConfig.gpus_per_worker:
        raise ConfigError(
            "cluster.gpus_per_worker",
            f"got {cfg.cluster.gpus_per_worker:g} with cluster.use_gpu=false, where it would do nothing; "
            "set cluster.use_gpu=true too, or leave it out",
        )
    if m.d_model % m.n_heads:
        raise ConfigError("model.n_heads", f"got {m.n_heads}; must divide model.d_model={m.d_model}")
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
        if src.kind in ("files", "hf") and not src.path:
            raise ConfigError(f"data.sources.{i}.path", f"missing; a `{src.kind}` source needs a local path")
    plan = batch_plan(cfg)
    batching.total_steps(plan, t.total_tokens)
    _adaptive_schedule(cfg)
    segments = batch_segments(cfg)  # a ramp's steps: each stretch whole updates, each batch size decomposable
    if t.stop_at_tokens is not None and not batching.updates_until(segments, t.stop_at_tokens):
        ends = [f"{s.start_tokens:,} + k x {s.plan.tokens_per_update:,}" for s in segments]
        raise ConfigError(
            "train.stop_at_tokens",
            f"got {t.stop_at_tokens:,}; no update ends there: valid are {' or '.join(ends)} up to the budget "
            f"{segments[-1].end_tokens:,}",
        )
    end = t.stop_at_tokens or segments[-1].end_tokens
    late = [at for at in t.checkpoint_at_tokens if at > end]
    if late:
        ends = "train.stop_at_tokens" if t.stop_at_tokens else "train.total_tokens in whole updates"
        raise ConfigError(
            "train.checkpoint_at_tokens", f"got {late[0]:,}; past the run's end at {end:,} tokens ({ends}), never taken"
        )
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
    _optimizer_keys(cfg)
    _optimizer_forms(cfg)
    if cfg.deepspeed.precision == "fp16" and not cfg.cluster.use_gpu:
        raise ConfigError(
            "deepspeed.precision", "got 'fp16'; fp16 needs a GPU (cluster.use_gpu=true); on CPU use fp32 or bf16"
        )
    _forced_zero_stage(cfg)
    if cfg.deepspeed.precision == "fp16" and zero_stage(cfg) == 0:
        # DeepSpeed 0.19.8's ZeRO-0 fp16 optimizer divides the gradients by a loss scale its
        # backward never applied: every update shrinks by it and clipping never acts.
        raise ConfigError(
            "deepspeed.precision",
            "got 'fp16' with deepspeed.zero_stage=0, where DeepSpeed unscales gradients it never scaled; "
            "use bf16, or fp16 with deepspeed.zero_stage 1 to 3",
        )
    workload_paths.check(cfg)  # e.g. hf: transformers reads the model's config


def _adaptive_schedule(cfg: Config) -> None:
    """batch.schedule=adaptive: the keys it needs and the keys only it uses. Its changes come at
    whole updates of the new batch, so with the budget (and a branch's stop) whole updates of the
    largest batch every ramp it may take ends there and the lr schedule never moves."""
    b, t = cfg.batch, cfg.train
    if b.schedule != ADAPTIVE:
        for key, given, default in (
            ("max_tokens_per_update", b.max_tokens_per_update, None),
            ("calibration", b.calibration, 1.0),
            ("calibration_from", b.calibration_from, None),
        ):
            if given != default:
                raise ConfigError(
                    f"batch.{key}",
                    f"got {given!r} with batch.schedule={b.schedule}, which does not use it; "
                    "set batch.schedule=adaptive, or leave it out",
                )
        return
    if b.ramp:
        raise ConfigError(
            "batch.ramp", "given with batch.schedule=adaptive, which writes its own ramp; give one or the other"
        )
    if not (cfg.gns.enabled and t.loss_normalization == "token"):
        raise ConfigError(
            "batch.schedule",
            "got 'adaptive', which follows the run's own noise scale; it needs gns.enabled=true and "
            "train.loss_normalization=token",
        )
    top = b.max_tokens_per_update
    if (
        top is None
        or top <= b.tokens_per_update
        or top % b.tokens_per_update
        or (top // b.tokens_per_update) & (top // b.tokens_per_update - 1)
    ):
        raise ConfigError(
            "batch.max_tokens_per_update",
            f"got {top!r}; batch.schedule=adaptive doubles batch.tokens_per_update={b.tokens_per_update:,}, so "
            f"the largest batch is it times a power of 2, e.g. {4 * b.tokens_per_update:,}",
        )
    for batch in adaptive_batches(cfg):  # each doubling must split into S x b x D x A
        try:
            batch_segments(cfg, [(0, batch)])
        except ConfigError as error:
            raise ConfigError("batch.max_tokens_per_update", f"the doubled batch {batch:,}: {error.message}") from None
    for key, tokens in (("train.total_tokens", t.total_tokens), ("train.stop_at_tokens", t.stop_at_tokens)):
        if tokens is not None and tokens % top:
            raise ConfigError(
                key,
                f"got {tokens:,}; with batch.schedule=adaptive it is whole updates of batch.max_tokens_per_update="
                f"{top:,} (so every ramp the run may take ends there): use {max(top, tokens // top * top):,}",
            )


def _forced_zero_stage(cfg: Config) -> None:
    """deepspeed.extra.zero_optimization.stage, when given, is the stage DeepSpeed runs: 0 to 3."""
    extra = zero_extra(cfg)
    if "stage" not in extra:
        return
    stage = extra["stage"]
    if isinstance(stage, bool) or not isinstance(stage, int) or not 0 <= stage <= 3:
        raise ConfigError(
            "deepspeed.extra.zero_optimization.stage", f"got {stage!r}; a ZeRO stage is an integer 0 to 3"
        )


def _optimizer_keys(cfg: Config) -> None:
    """Each optimizer's own keys: with sgd the AdamW-only keys stay at their defaults (they would
    silently do nothing), with adamw optim.momentum stays 0 (AdamW's momentum is optim.beta1)."""
    o = cfg.optim
    if o.name == "sgd":
        defaults = {f.name: f.default for f in fields(OptimConfig)}
        for key in ADAMW_ONLY_KEYS:
            given, default = getattr(o, key), defaults[key]
            if given != default:
                raise ConfigError(
                    f"optim.{key}",
                    f"got {given!r} with optim.name=sgd, which does not use it (AdamW only); "
                    f"leave it at its default {'null' if default is None else repr(default)}, or set optim.name=adamw",
                )
    elif o.momentum != 0:
        raise ConfigError(
            "optim.momentum",
            f"got {o.momentum!r} with optim.name={o.name}, which does not use it (sgd only); "
            "leave it 0 (AdamW's momentum is optim.beta1), or set optim.name=sgd",
        )


def _optimizer_forms(cfg: Config) -> None:
    """beta2 and weight decay are given per step or in tokens, not both; the token forms must give
    values AdamW can use (derived.adamw_constants computes them)."""
    o, tpu = cfg.optim, cfg.batch.tokens_per_update
    for step_key, token_key in (("beta2", "beta2_half_life_tokens"), ("weight_decay", "weight_decay_timescale_share")):
        if getattr(o, step_key) is not None and getattr(o, token_key) is not None:
            raise ConfigError(
                f"optim.{token_key}",
                f"got {getattr(o, token_key)!r} together with optim.{step_key}={getattr(o, step_key)!r}; "
                "give one of the two forms (the other stays null)",
            )
    if o.beta2_half_life_tokens is not None and adamw_constants(cfg).beta2 >= 1.0:
        raise ConfigError(
            "optim.beta2_half_life_tokens",
            f"got {o.beta2_half_life_tokens!r}; so long beside batch.tokens_per_update={tpu:,} that beta2 "
            "rounds to 1 (Adam's second moment would never be corrected); use a shorter half-life",
        )
    share = o.weight_decay_timescale_share
    if share is not None:
        if o.lr == 0:
            raise ConfigError(
                "optim.weight_decay_timescale_share",
                f"got {share!r} with optim.lr=0; a timescale of lr x weight decay needs optim.lr > 0 "
                "(or give optim.weight_decay)",
            )
        one_update = tpu / cfg.train.total_tokens
        if share < one_update:
            raise ConfigError(
                "optim.weight_decay_timescale_share",
                f"got {share!r}; shorter than one update ({tpu:,} of train.total_tokens="
                f"{cfg.train.total_tokens:,} tokens, a share of {one_update:.3g}), so lr x weight decay > 1; "
                f"use at least {one_update:.3g}",
            )
