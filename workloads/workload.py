"""What the train loop needs from a workload (the `Workload` protocol), the two built-in ones,
and `build`, which makes the one that `model.name` names through orchestrator/core/workload_paths.py
(public as workloads.registry).

A workload owns its model and its data and answers three questions: which micro-batch does
worker r see at accumulation step a of update u, what is the *summed* token loss of a
micro-batch (and how many real tokens it holds), and what is the held-out loss. A third one is
a class with the members of `Workload` and a constructor `(cfg, plan, device)`, registered
with `@workload_paths.register("name")`; `model.name: name` then validates and builds it. A static
`costs(cfg) -> ModelCosts` (optional) tells `plan`, `sweep --dry-run` and
`batch.micro_batch_size: auto` its size, FLOPs and memory without building the model. A static
`preflight(cfg, plan)` (optional) is what the driver checks before Ray starts (`preflight` below);
without one, the workload is built once on the CPU.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Protocol, Sequence, Tuple, runtime_checkable

import torch
from torch import nn

from orchestrator.core import workload_paths
from orchestrator.core.errors import ConfigError
from orchestrator.core.schema import Config
from orchestrator.formulas.batching import BatchPlan
from orchestrator.formulas.memory import ModelCosts


@dataclass
class MicroBatch:
    tensors: Dict[str, torch.Tensor]
    """Model inputs and targets, already on the worker's device."""
    real_tokens: int
    """Loss-bearing tokens: the weight of this micro-batch in the update's mean."""
    slots: int
    """Token slots (real + masked): for packing efficiency."""
    source_tokens: Dict[str, int]
    """Real tokens per data source (mixture shares)."""


@runtime_checkable
class Workload(Protocol):
    """What the trainer needs from a workload. Built by a factory `(cfg, plan, device)`, after
    `build` has seeded torch with train.seed (so every rank and every split starts alike)."""

    model: nn.Module
    """The module DeepSpeed wraps; `summed_loss` calls it through the engine."""
    flops_per_token: float
    """Training FLOPs per token (forward + backward), for perf/mfu."""
    source_names: Sequence[str]
    """Names of the data sources that MicroBatch.source_tokens counts (empty: no mixture)."""

    def param_groups(self) -> List[Dict[str, Any]]:
        """AdamW parameter groups of `model`, each with its own weight_decay."""
        ...

    def micro_batch(self, first: int, plan: BatchPlan, rank: int, accum_step: int) -> MicroBatch:
        """The training micro-batch of worker `rank` at accumulation step `accum_step` of the
        update that starts at stream position `first` (sequences consumed so far) and is split
        as `plan` (the current segment's, which changes along a batch.ramp): a pure function of
        these and the config, so that every split b x D x A of an update sees the same examples
        (docs/design.md 4.1, 4.5) and a run that changes its batch size continues where it was."""
        ...

    def summed_loss(self, engine: nn.Module, mb: MicroBatch) -> Tuple[torch.Tensor, torch.Tensor]:
        """(loss summed over mb's real tokens, their count), under the document mask: the sum,
        not the mean, since the trainer divides by the update's global real-token count (4.2)."""
        ...

    def eval_batches(self, rank: int, world: int) -> List[MicroBatch]:
        """This rank's share of the held-out set, the same for every batch size and split."""
        ...


def missing_members(obj: object) -> List[str]:
    """The members of `Workload` that obj lacks (empty when it satisfies the protocol)."""
    members = [*Workload.__annotations__, "param_groups", "micro_batch", "summed_loss", "eval_batches"]
    return [m for m in members if not hasattr(obj, m)]


def costs(cfg: Config) -> Optional[ModelCosts]:
    """The workload's size, FLOPs and activation memory from its config (None: it does not say)."""
    factory = workload_paths.factory(cfg.model.name)
    return factory.costs(cfg) if hasattr(factory, "costs") else None


def preflight(cfg: Config, plan: BatchPlan) -> None:
    """The checks of model.name's workload that need its data or its model, in the driver before
    Ray starts: its factory's static `preflight(cfg, plan)`, else the workload built once on this
    machine's CPU. A ConfigError (exit 2) says what is wrong; a workload of your own that fails in
    any other way is one too, naming model.name."""
    factory = workload_paths.factory(cfg.model.name)
    try:
        if hasattr(factory, "preflight"):
            factory.preflight(cfg, plan)
        else:
            build(cfg, plan, torch.device("cpu"))
    except ConfigError:
        raise
    except Exception as exc:
        if cfg.model.name in workload_paths.BUILTIN:
            raise  # a built-in's own failure is a bug to see whole, not bad input
        raise ConfigError("model.name", f"got {cfg.model.name!r}; {exc}") from None


def check_text_run(cfg: Config, plan: BatchPlan, meta_model: Callable[[], nn.Module]) -> None:
    """The preflight of a workload over packed documents: the corpus holds an update's tokens
    (its token caches built on the way, for the workers), and model.init_from's names and shapes
    match the model's, which `meta_model` builds on the meta device (no memory, no data)."""
    from workloads.text import packing
    from workloads.train.checkpoint import check_weights

    packing.check_corpus(cfg, plan.tokens_per_update)
    if cfg.model.init_from:
        with torch.device("meta"):
            model = meta_model()
        check_weights(model, cfg.model.init_from)


def own_params(name: str, flat: Dict[str, Any]) -> Dict[str, Any]:
    """A run's flattened config `flat` without the keys that another built-in workload reads and
    workload `name` does not (each built-in factory's `config_keys`; a trailing '.' names a
    section): a gpt run logs no linear regression's noise, a linreg run no transformer's shape. A
    workload of your own may read any key, and logs every one."""
    if name not in workload_paths.BUILTIN:
        return dict(flat)
    own = set(workload_paths.factory(name).config_keys)
    others = {k for b in workload_paths.BUILTIN if b != name for k in workload_paths.factory(b).config_keys} - own
    return {k: v for k, v in flat.items() if not any(k == u or (u.endswith(".") and k.startswith(u)) for u in others)}


TEXT_KEYS = (
    *("model.n_layers", "model.n_heads", "model.d_model", "model.mlp_ratio", "model.max_seq_len", "model.vocab_size"),
    *("data.sources.", "data.tokenizer", "data.eval_fraction", "data.max_documents_per_source", "data.shard_dir"),
)
"""The keys a transformer over packed documents reads that linreg does not (`config_keys`)."""


def token_micro_batch(batch, source_names: Sequence[str], device: torch.device) -> MicroBatch:
    """A MicroBatch of a packed token batch of workloads/text/packing.py, for workloads on that data."""
    tensors = {k: getattr(batch, k).to(device) for k in ("inputs", "targets", "positions", "doc_ids", "loss_mask")}
    per_source = batch.loss_mask.sum(dim=1)
    source_tokens = {name: int(per_source[batch.source_ids == i].sum()) for i, name in enumerate(source_names)}
    return MicroBatch(tensors, int(batch.real_tokens), batch.loss_mask.numel(), source_tokens)


class GPTWorkload:
    """`gpt`: the decoder-only transformer of workloads/builtin/gpt.py over packed documents."""

    config_keys = TEXT_KEYS

    def __init__(self, cfg: Config, plan: BatchPlan, device: torch.device):
        from workloads.builtin import gpt
        from workloads.text import packing

        self._model_lib = gpt
        self.cfg, self.plan, self.device = cfg, plan, device
        shape = gpt.GPTConfig.of(cfg.model)
        self.model: nn.Module = gpt.GPT(shape)
        if cfg.model.init_from:
            from workloads.train.checkpoint import load_weights

            load_weights(self.model, cfg.model.init_from)
        self.train_data = packing.TokenDataset(cfg, "train")
        self.eval_data = packing.TokenDataset(cfg, "eval")
        self.source_names = [s.name for s in cfg.data.sources]
        self.flops_per_token = gpt.flops_per_token(shape, cfg.data.seq_len)

    @staticmethod
    def costs(cfg: Config) -> ModelCosts:
        from workloads.builtin import gpt

        shape, S = gpt.GPTConfig.of(cfg.model), cfg.data.seq_len
        dtype_bytes = 4 if cfg.deepspeed.precision == "fp32" else 2
        dense_mask = not (cfg.cluster.use_gpu and gpt.HAS_FLEX)  # as GPT.forward chooses
        return ModelCosts(
            params=gpt.count_params(shape, exclude_embeddings=False),
            flops_per_token=gpt.flops_per_token(shape, S),
            activation_bytes_per_sequence=gpt.activation_bytes(shape, S, dtype_bytes, dense_mask),
            compute_params=gpt.count_params(shape),  # no position table; the tied head once
        )

    @staticmethod
    def preflight(cfg: Config, plan: BatchPlan) -> None:
        from workloads.builtin import gpt

        check_text_run(cfg, plan, lambda: gpt.GPT(gpt.GPTConfig.of(cfg.model)))

    def param_groups(self) -> List[Dict[str, Any]]:
        return self._model_lib.param_groups(self.model, self.cfg.optim.weight_decay)

    def _wrap(self, batch) -> MicroBatch:
        return token_micro_batch(batch, self.source_names, self.device)

    def micro_batch(self, first: int, plan: BatchPlan, rank: int, accum_step: int) -> MicroBatch:
        return self._wrap(self.train_data.micro_batch(first, plan, rank, accum_step))

    def summed_loss(self, engine: nn.Module, mb: MicroBatch) -> Tuple[torch.Tensor, torch.Tensor]:
        t = mb.tensors
        logits = engine(t["inputs"], t["positions"], t["doc_ids"])
        return self._model_lib.token_losses(logits, t["targets"], t["loss_mask"])

    def eval_batches(self, rank: int, world: int) -> List[MicroBatch]:
        """This rank's share of the one held-out set (the same sequences for every b and D)."""
        batches = self.eval_data.eval_batches(self.cfg.train.eval_tokens, self.plan.micro_batch_size, rank, world)
        return [self._wrap(b) for b in batches]


class LinRegWorkload:
    """`linreg`: linear regression with a known gradient noise scale; one example = one token."""

    config_keys = ("model.dim", "model.noise_std", "model.w_star_norm")

    def __init__(self, cfg: Config, plan: BatchPlan, device: torch.device):
        from workloads.builtin import linreg

        m = cfg.model
        self.cfg, self.plan, self.device = cfg, plan, device
        self.model: nn.Module = linreg.LinRegModel(m.dim)
        self.data = linreg.LinRegData(m.dim, m.noise_std, m.w_star_norm, cfg.train.seed)
        self.source_names: List[str] = []
        self.flops_per_token = 6.0 * m.dim
        self._losses = linreg.LinRegModel.token_losses

    @staticmethod
    def costs(cfg: Config) -> ModelCosts:
        dim = cfg.model.dim  # a "sequence" is seq_len examples of dim inputs and one label
        return ModelCosts(dim, 6.0 * dim, cfg.data.seq_len * (dim + 2) * 4.0, compute_params=dim)

    @staticmethod
    def preflight(cfg: Config, plan: BatchPlan) -> None:
        """Nothing to check: its data is drawn, not read, and validation has checked its keys."""

    def param_groups(self) -> List[Dict[str, Any]]:
        return [{"params": list(self.model.parameters()), "weight_decay": 0.0}]

    def _wrap(self, x: torch.Tensor, y: torch.Tensor) -> MicroBatch:
        return MicroBatch({"x": x.to(self.device), "y": y.to(self.device)}, len(y), len(y), {})

    def micro_batch(self, first: int, plan: BatchPlan, rank: int, accum_step: int) -> MicroBatch:
        start = (
            accum_step * plan.num_workers + rank
        ) * plan.micro_batch_size  # the slot mapping of workloads/text/packing.py
        return self._wrap(*self.data.examples(first + start, plan.micro_batch_size))

    def summed_loss(self, engine: nn.Module, mb: MicroBatch) -> Tuple[torch.Tensor, torch.Tensor]:
        return self._losses(engine(mb.tensors["x"]), mb.tensors["y"])

    EVAL_CHUNK = 256
    """Held-out examples per eval forward: chunks of a fixed size, whatever b, so the loss's
    standard error (over the chunks) is the same for every split."""

    def eval_batches(self, rank: int, world: int) -> List[MicroBatch]:
        """This rank's contiguous part of all the held-out examples, in chunks."""
        x, y = self.data.eval_batch(self.cfg.train.eval_tokens)
        mine = zip(
            x.tensor_split(world)[rank].split(self.EVAL_CHUNK), y.tensor_split(world)[rank].split(self.EVAL_CHUNK)
        )
        return [self._wrap(xs, ys) for xs, ys in mine]


def build(cfg: Config, plan: BatchPlan, device: torch.device) -> Workload:
    """The workload registered as model.name. Seeds the model init from train.seed, so every
    split and every rank starts alike."""
    torch.manual_seed(cfg.train.seed)
    work = workload_paths.factory(cfg.model.name)(cfg, plan, device)
    missing = missing_members(work)
    if missing:
        raise TypeError(
            f"workload {cfg.model.name!r} lacks {', '.join(missing)} of the Workload protocol (workloads/workload.py)"
        )
    if len(inspect.signature(work.micro_batch).parameters) == 3:
        raise TypeError(
            f"workload {cfg.model.name!r}: micro_batch(update, rank, accum_step) is the old signature; it is now "
            "micro_batch(first, plan, rank, accum_step), first = update x plan.sequences_per_update for a fixed "
            "batch (docs/workloads.md)"
        )
    return work
