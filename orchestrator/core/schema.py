"""The one typed configuration schema: a dataclass per section, a docstring under every field.

Pure: imports no Ray, DeepSpeed or MLflow. Loading it (defaults <- YAML <- overrides) is
orchestrator/core/config.py; the rule of each field's valid values is orchestrator/core/validation.py's
FIELDS.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Dict, List, Optional, Tuple

from omegaconf import MISSING

AUTO = "auto"
"""batch.micro_batch_size: the largest that fits, found before the run starts."""


@dataclass
class HFModelConfig:
    architecture: str = "llama"
    """model.name=hf only: a Hugging Face transformers model type, e.g. llama, gpt_neox, qwen2
    (built fresh from its config class; no weights are downloaded)."""
    extra: Dict[str, Any] = field(default_factory=dict)
    """More keys of that config class (e.g. {num_key_value_heads: 2, rope_theta: 10000.0})."""


@dataclass
class ModelConfig:
    name: str = "gpt"
    """Workload: `gpt` (decoder-only transformer), `linreg` (noise scale known in closed form),
    `hf` (a transformers model, model.hf) or `package.module:factory` (your own, see docs/workloads.md)."""
    n_layers: int = 2
    """Transformer blocks."""
    n_heads: int = 4
    """Attention heads; must divide d_model."""
    d_model: int = 128
    """Residual stream width."""
    mlp_ratio: int = 4
    """MLP hidden width as a multiple of d_model."""
    max_seq_len: int = 256
    """Positions the model can embed; data.seq_len may not exceed it."""
    vocab_size: Optional[int] = None
    """Vocabulary size; None = the tokenizer's (257 for bytes: 256 bytes + EOS). Given, it must
    equal the tokenizer's."""
    hf: HFModelConfig = field(default_factory=HFModelConfig)
    """model.name=hf only: which transformers model; its shape comes from the keys above."""
    init_from: Optional[str] = None
    """A local safetensors file (or a folder holding model.safetensors) to start from, e.g. what
    `orchestrator export` wrote; None = a fresh init."""
    compile: Optional[bool] = None
    """torch.compile the whole model; None = on when training on GPU (on CPU it does not pay)."""
    dim: int = 16
    """linreg only: input dimension d."""
    noise_std: float = 1.0
    """linreg only: label noise sigma."""
    w_star_norm: float = 1.0
    """linreg only: norm of the true weight vector w*."""


@dataclass
class SourceConfig:
    name: str = MISSING
    """Name used in logs and in `data/share/<name>`."""
    kind: str = "files"
    """`code`, `prose`, `arithmetic` (built in, no download), `files` (a user corpus) or `hf`
    (a Hugging Face `datasets` dataset on local disk)."""
    path: Optional[str] = None
    """files: a directory, file or glob of .txt, .jsonl or .parquet files. hf: a folder written by
    `save_to_disk`, or a folder of parquet, json(l) or text files."""
    weight: float = 1.0
    """Share of each update's tokens drawn from this source (weights are normalised)."""
    text_field: str = "text"
    """jsonl/parquet/hf only: the field holding the document text."""
    split: str = "train"
    """hf only: the dataset split to read."""


def _default_sources() -> List[SourceConfig]:
    return [
        SourceConfig(name="code", kind="code", weight=0.45),
        SourceConfig(name="prose", kind="prose", weight=0.45),
        SourceConfig(name="arithmetic", kind="arithmetic", weight=0.10),
    ]


@dataclass
class DataConfig:
    seq_len: int = 128
    """S: tokens per packed sequence."""
    tokenizer: str = "bytes"
    """`bytes` (UTF-8 bytes + EOS) or the path of a Hugging Face `tokenizer.json` (e.g. one
    `orchestrator prepare --train-tokenizer` wrote)."""
    sources: List[SourceConfig] = field(default_factory=_default_sources)
    """The mixture: name, kind, location and weight of each source."""
    eval_fraction: float = 0.05
    """Share of each source's documents held out for evaluation (split by whole documents)."""
    max_documents_per_source: int = 4000
    """Cap on documents read per source (the built-in sources are large); 0 = no cap."""
    shard_dir: Optional[str] = None
    """Token shards written by `orchestrator prepare`; used instead of tokenizing on start."""


@dataclass
class RampStep:
    from_tokens: int = MISSING
    """The tokens seen when this batch size starts (the first step at 0)."""
    tokens_per_update: int = MISSING
    """Global tokens per optimizer update from then on."""


@dataclass
class BatchConfig:
    tokens_per_update: int = 4096
    """Global tokens per optimizer update (S x b x D x A); with batch.ramp, its first batch size."""
    micro_batch_size: Any = 8
    """b: the largest number of sequences per worker per forward/backward that fits in memory; or
    `auto`: the largest that fits the trial's device, probed there once per shape
    (orchestrator/driver/micro_batch.py)."""
    grad_accum_steps: Optional[int] = None
    """A: derived when omitted (the fewest steps that fit, but D x A >= 2 with gns.enabled so that
    B_simple is measured), checked when given."""
    ramp: Optional[List[RampStep]] = None
    """A batch-size schedule: the tokens per update from each step's from_tokens on (the first at
    0, each stretch whole updates); sets batch.tokens_per_update to its first batch size."""
    ramp_lr_scaling: Any = 0
    """The peak lr times (B / first B)^alpha from each change of a ramp on: sqrt (0.5), linear (1),
    a number, or 0 for none."""
    schedule: str = "fixed"
    """fixed: the batch (or batch.ramp) as given; adaptive: the run doubles its batch from its own
    smoothed noise scale (orchestrator/formulas/adaptive_batch.py) up to max_tokens_per_update."""
    max_tokens_per_update: Optional[int] = None
    """adaptive only: the largest batch, tokens_per_update x a power of 2; train.total_tokens is
    whole updates of it, so every ramp the run may take ends at the same budget."""
    calibration: float = 1.0
    """adaptive only: the critical batch size over B_simple (1: trust B_simple)."""
    calibration_from: Optional[str] = None
    """adaptive only: a branch study (sweep name) in the same store whose branched critical batch
    size over B_simple, the median over its resolved points, times 1/4 (so the batch doubles where
    it passes 8x the batch, as the suggested ramp does), replaces calibration (the driver reads it)."""


@dataclass
class ClusterConfig:
    num_workers: int = 1
    """D: data-parallel Ray Train workers."""
    address: Optional[str] = None
    """Ray address to join; None starts a local Ray on 127.0.0.1."""
    cpus_per_worker: float = 1.0
    """CPUs Ray reserves per worker (fractions allowed); torch threads follow it."""
    use_gpu: bool = False
    """Train on GPUs (cluster.gpus_per_worker each)."""
    gpus_per_worker: float = 1.0
    """use_gpu only: GPUs Ray reserves per worker, in (0, 1]; a fraction lets small trials share
    a GPU (each worker still uses one device)."""
    placement_strategy: str = "PACK"
    """How Ray places the workers: PACK (fewest nodes), SPREAD, STRICT_PACK (one node) or
    STRICT_SPREAD (one node each)."""


DEFAULT_BETA2 = 0.95
"""optim.beta2 when neither it nor optim.beta2_half_life_tokens is given."""
DEFAULT_WEIGHT_DECAY = 0.1
"""optim.weight_decay when neither it nor optim.weight_decay_timescale_share is given."""
OPTIMIZERS = ("adamw", "sgd")
"""optim.name's values."""
ADAMW_ONLY_KEYS = ("beta1", "beta2", "beta2_half_life_tokens", "eps", "weight_decay_timescale_share")
"""optim.* keys only AdamW reads: with optim.name=sgd each must stay at its default."""


@dataclass
class OptimConfig:
    lr: float = 1e-3
    """Peak learning rate (0 freezes the weights, for measurement runs)."""
    weight_decay: Optional[float] = None
    """AdamW decoupled weight decay per step (not applied to norms and biases); None = 0.1, or
    what optim.weight_decay_timescale_share gives. With optim.name=sgd: SGD's coupled L2
    coefficient, None = 0."""
    weight_decay_timescale_share: Optional[float] = None
    """Weight decay as a timescale, a share of the run: weight decay = B / (optim.lr x share x
    train.total_tokens) with B = batch.tokens_per_update; instead of optim.weight_decay."""
    beta1: float = 0.9
    """AdamW beta1."""
    beta2: Optional[float] = None
    """AdamW beta2 per step; None = 0.95, or what optim.beta2_half_life_tokens gives."""
    beta2_half_life_tokens: Optional[float] = None
    """Tokens over which Adam's second-moment average halves an old gradient's weight:
    beta2 = 0.5 ** (B / N) with B = batch.tokens_per_update; instead of optim.beta2."""
    eps: float = 1e-8
    """AdamW epsilon."""
    grad_clip: float = 1.0
    """Global gradient-norm clip; 0 disables it."""
    name: str = "adamw"
    """adamw (torch AdamW) or sgd (torch SGD: optim.momentum, optim.weight_decay as coupled L2;
    the AdamW-only keys stay at their defaults)."""
    momentum: float = 0.0
    """sgd only: heavy-ball momentum (torch.optim.SGD's, no dampening or Nesterov); 0 = plain SGD."""


@dataclass
class ScheduleConfig:
    warmup_tokens: int = 0
    """Linear warmup length in tokens: 0, or more than one update (batch.tokens_per_update)."""
    decay: str = "cosine"
    """After warmup: cosine, linear, wsd (warmup-stable-decay) or constant."""
    min_lr_ratio: float = 0.1
    """Floor of the decay as a fraction of optim.lr."""
    wsd_decay_share: float = 0.2
    """wsd only: final share of the budget over which the LR decays."""


@dataclass
class TrainConfig:
    total_tokens: int = 262144
    """Token budget of a run; rounded down to whole updates."""
    seed: int = 0
    """Seed of model init and data order."""
    report_every_tokens: int = 8192
    """Cadence of metrics to Ray Train and MLflow (at least one update)."""
    eval_every_tokens: int = 65536
    """Cadence of held-out evaluation; the last update is always evaluated."""
    eval_tokens: int = 16384
    """Held-out tokens per evaluation."""
    checkpoint_every_tokens: int = 65536
    """Cadence of checkpoints; 0 = only at the end."""
    keep_checkpoints: int = 2
    """Newest checkpoints kept by Ray Train."""
    checkpoint_at_tokens: List[int] = field(default_factory=list)
    """Checkpoints at these token counts too (the first update to reach each): the branch
    points of a branch study."""
    run_name: Optional[str] = None
    """Name of the run; re-running with the same name resumes it."""
    storage_path: str = "runs"
    """Checkpoints and run records: a path (relative to the working directory) or a URI
    (`s3://`, `gs://`, `file://`), which Ray reads through pyarrow. More than one node needs
    storage every node sees: a shared filesystem or an object store."""
    max_failures: int = 1
    """Restarts of a failed worker group, each from the latest checkpoint."""
    loss_normalization: str = "token"
    """`token`: every real token of the update weighs the same (decomposition-invariant).
    `micro_batch`: the naive mean per micro-batch, then 1/A and 1/D (for comparison only)."""
    start_from_checkpoint: Optional[str] = None
    """A branch: the folder of another run's checkpoint (weights, optimizer, RNG, tokens seen
    and so the stream position), continued in this run with its own MLflow history."""
    stop_at_tokens: Optional[int] = None
    """End the run when it has seen this many tokens (an update boundary), the schedule still
    that of train.total_tokens: a branch trains a stretch of the base run's schedule."""


@dataclass
class DeepSpeedConfig:
    zero_stage: int = 2
    """ZeRO stage 0..3."""
    precision: str = "fp32"
    """fp32, bf16 or fp16 (fp16 needs a GPU)."""
    extra: Dict[str, Any] = field(default_factory=dict)
    """Raw DeepSpeed config merged last (e.g. {zero_optimization: {overlap_comm: true}})."""


@dataclass
class TrackingConfig:
    uri: str = "sqlite:///mlflow.db"
    """MLflow tracking URI; the default is a SQLite file in the working directory."""
    experiment: str = "orchestrator"
    """MLflow experiment name."""
    flush_every_s: float = 5.0
    """Seconds between batched, asynchronous MLflow writes."""
    max_buffered_points: int = 100000
    """Points held while the tracking server is unreachable; past this the run fails."""
    system_metrics: Optional[bool] = None
    """MLflow system metrics (CPU, memory, GPU); None = on when training on GPU."""
    system_metrics_interval_s: float = 10.0
    """Seconds between system-metric samples (MLflow's sampler)."""
    sinks: List[str] = field(default_factory=list)
    """Extra trackers beside MLflow, each named by import path "package.module:Attribute": a class
    or factory of a tracking.tracker.RunSink, given the store (tracking.sinks.SinkContext) and fed
    every param, metric, tag, text artifact and status that MLflow takes (docs/configuration.md)."""


@dataclass
class GNSConfig:
    enabled: bool = True
    """Measure the gradient noise scale B_simple during training."""
    adam: bool = True
    """With AdamW, also measure it on the gradient as AdamW preconditions it, g / (sqrt(v_hat) +
    eps) (gns/b_simple_adam): a whole fp32 copy of that denominator on every worker, 4 bytes per
    parameter (in the memory model), refreshed once per update. No effect with optim.name: sgd."""
    ema_tokens: Optional[int] = None
    """Time constant, in tokens, of the EMAs of |G|^2 and tr(Sigma): an estimate's weight falls by
    a factor e every ema_tokens tokens, so every batch size smooths over the same stretch of
    training. None = a fiftieth of train.total_tokens."""


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    batch: BatchConfig = field(default_factory=BatchConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    deepspeed: DeepSpeedConfig = field(default_factory=DeepSpeedConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    gns: GNSConfig = field(default_factory=GNSConfig)

    secret_keys: ClassVar[Tuple[str, ...]] = ()
    """Not a key (a ClassVar, outside the schema): the keys whose values `config.load` read from
    the environment (`${oc.env:NAME}`), which `config.to_dict` redacts wherever the config is
    logged, printed or written."""
