"""The data pipeline inside each training worker: cached source tokens -> packed sequences ->
the micro-batches of an update.

Documents are split into train/eval by a hash of their index, laid out in a seeded order and
cut into windows of S+1 tokens. The training stream is one fixed sequence of such windows,
given the data config and `train.seed`: position k draws its source from `workloads/text/mixture.py`
(every prefix holds each source within one sequence of its weight) and takes that source's next
window. Update u consumes positions [u N, (u+1) N) of N sequences, sliced over accumulation
steps and workers, so every batch size sees the same tokens at equal tokens (docs/design.md 4.5) and
every b x D x A split of an update the same sequences (4.1). The corpus itself (sources,
tokenizer, token cache) is `workloads/text/corpus.py`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Sequence, Tuple

import numpy as np
import torch

from orchestrator.core.errors import ConfigError
from orchestrator.core.schema import Config
from orchestrator.formulas.batching import BatchPlan
from workloads.text import mixture
from workloads.text.corpus import SourceTokens, hash64, heldout_mask, load_source

EVAL_SEED = 0  # eval must not depend on train.seed: every run is scored on the same tokens

# ---------------------------------------------------------------- split and packing


def _rng(*parts: int | str) -> np.random.Generator:
    """A generator keyed by named parts, e.g. (seed, source name, "epoch", 3)."""
    return np.random.default_rng([hash64(p) if isinstance(p, str) else int(p) % 2**64 for p in parts])


class PackedSource:
    """One source's split as a virtual stream of documents, each followed by EOS.

    Only the document order and its cumulative lengths are kept (int64, small); a window is
    gathered from the memmap with searchsorted, never by materialising the stream.
    """

    def __init__(self, data: SourceTokens, docs: np.ndarray, seq_len: int, seed: int, name: str, key: str):
        self.tokens, self.seq_len, self.seed, self.name, self.key = data.tokens, seq_len, seed, name, key
        self.eos = data.eos
        self.doc_order = docs[_rng(seed, name, "order").permutation(len(docs))]
        self.starts = data.offsets[:-1][self.doc_order].astype(np.int64)
        self.lens = np.diff(data.offsets)[self.doc_order].astype(np.int64)
        self.cum = np.concatenate([[0], np.cumsum(self.lens + 1)]).astype(np.int64)
        self.num_tokens = int(self.cum[-1])
        self.num_sequences = max(0, (self.num_tokens - 1) // seq_len)
        self._perms: Dict[int, np.ndarray] = {}

    def sequence_index(self, counters: np.ndarray) -> np.ndarray:
        """Counter c -> sequence: epoch c // n uses its own seeded permutation of all n sequences."""
        n = self.num_sequences
        if n == 0:
            raise ConfigError(
                self.key,
                f"source {self.name!r} has {self.num_tokens} tokens in this split, "
                f"fewer than one sequence (data.seq_len + 1 = {self.seq_len + 1})",
            )
        out, epochs = np.empty(len(counters), np.int64), counters // n
        for epoch in map(int, np.unique(epochs)):
            if epoch not in self._perms:  # keep only neighbours: a permutation costs 8 bytes a sequence
                self._perms = {e: p for e, p in self._perms.items() if abs(e - epoch) <= 1}
                self._perms[epoch] = _rng(self.seed, self.name, "epoch", epoch).permutation(n)
            out[epochs == epoch] = self._perms[epoch][counters[epochs == epoch] % n]
        return out

    def windows(self, seqs: np.ndarray) -> Dict[str, np.ndarray]:
        """Sequence j = stream[j*S : j*S + S + 1], with per-position document bookkeeping."""
        S = self.seq_len
        p = np.asarray(seqs, np.int64)[:, None] * S + np.arange(S + 1)
        k = np.searchsorted(self.cum, p, side="right") - 1  # document (in stream order) at each position
        off = p - self.cum[k]
        eos = off == self.lens[k]
        tokens = np.where(eos, self.eos, self.tokens[np.where(eos, 0, self.starts[k] + off)]).astype(np.int64)
        first = np.maximum(self.cum[k[:, :S]], p[:, :1])  # a document cut by the window starts at 0
        return {
            "origins": np.stack(
                [self.doc_order[np.minimum(k[:, 0], len(self.doc_order) - 1)], p[:, 0] - self.cum[k[:, 0]]], 1
            ),
            "inputs": tokens[:, :S],
            "targets": tokens[:, 1:],
            "positions": p[:, :S] - first,
            "doc_ids": k[:, :S] - k[:, :1],
            "loss_mask": (~eos[:, :S]).astype(np.float32),  # an EOS input would predict the next document
        }


# ---------------------------------------------------------------- batches and the mixture


@dataclass
class Batch:
    """Sequences of a micro-batch (or update): tensors [b, S], except source_ids [b]."""

    inputs: torch.Tensor
    targets: torch.Tensor
    positions: torch.Tensor
    doc_ids: torch.Tensor
    loss_mask: torch.Tensor
    source_ids: torch.Tensor
    origins: torch.Tensor
    """[b, 2]: the document (index in its source's token file) and offset the sequence starts at."""

    @property
    def real_tokens(self) -> int:
        """Loss-bearing tokens: what the token-weighted loss divides by (docs/design.md 4.2)."""
        return int(self.loss_mask.sum().item())


def packing_efficiency(batch: Batch) -> float:
    return batch.real_tokens / max(batch.loss_mask.numel(), 1)


def source_token_shares(batch: Batch, names: Sequence[str]) -> Dict[str, float]:
    """Share of the batch's loss-bearing tokens that came from each source."""
    per_seq = batch.loss_mask.sum(dim=1)
    total = max(float(per_seq.sum()), 1.0)
    return {name: float(per_seq[batch.source_ids == i].sum()) / total for i, name in enumerate(names)}


def _to_batch(parts: List[Dict[str, np.ndarray]], order: np.ndarray, sources: np.ndarray) -> Batch:
    """Stack per-source windows and put the rows back in slot order."""
    fields = {name: torch.from_numpy(np.concatenate([p[name] for p in parts])[order]) for name in parts[0]}
    return Batch(source_ids=torch.as_tensor(np.asarray(sources), dtype=torch.int64), **fields)


class TokenDataset:
    """The mixture of a config's sources for one split ("train" or "eval")."""

    def __init__(self, cfg: Config, split: str = "train"):
        if split not in ("train", "eval"):
            raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
        self.split, self.seq_len = split, cfg.data.seq_len
        self.names = [s.name for s in cfg.data.sources]
        # As configured, not normalised: mixture.shares reads 7 and 2 as 7/9 exactly, where the
        # floats 0.777...8 and 0.222...2 would only be kept to 1/65,536.
        self.weights = np.array([s.weight for s in cfg.data.sources], np.float64)
        self.seed = cfg.train.seed if split == "train" else EVAL_SEED
        self.sources: List[PackedSource] = []
        for i, src in enumerate(cfg.data.sources):
            data = load_source(cfg, i)
            held = heldout_mask(src.name, data.canonical, cfg.data.eval_fraction)
            docs = np.flatnonzero(held if split == "eval" else ~held)
            self.sources.append(PackedSource(data, docs, self.seq_len, self.seed, src.name, f"data.sources.{i}"))

    def stream_slots(self, first: int, count: int) -> Tuple[np.ndarray, np.ndarray]:
        """(source, per-source counter) of stream positions [first, first + count)."""
        return mixture.assign(self.weights, np.arange(first, first + count))

    def update_batch(self, update_index: int, num_sequences: int) -> Batch:
        """The whole global batch of one optimizer update."""
        return self._gather(*self.stream_slots(update_index * num_sequences, num_sequences))

    def micro_batch(self, first: int, plan: BatchPlan, rank: int, accum_step: int) -> Batch:
        """Worker `rank`'s slice at `accum_step` of the update whose first sequence is stream
        position `first` (the sequences consumed before it): positions first + accum_step*D*b +
        rank*b + [0, b). A run that changes its batch size continues where it was."""
        b, D = plan.micro_batch_size, plan.num_workers
        if not (0 <= rank < D and 0 <= accum_step < plan.grad_accum_steps):
            raise ValueError(f"rank {rank} / accum_step {accum_step} outside D={D}, A={plan.grad_accum_steps}")
        return self._gather(*self.stream_slots(first + accum_step * D * b + rank * b, b))

    def sequence_batch(self, source: int, seqs: Sequence[int]) -> Batch:
        """Windows `seqs` of one source in stream order (no epoch permutation): for tests and tools."""
        return _to_batch(
            [self.sources[source].windows(np.asarray(seqs))], np.arange(len(seqs)), np.full(len(seqs), source)
        )

    def eval_batches(self, num_tokens: int, batch_size: int, rank: int = 0, world: int = 1) -> List[Batch]:
        """Worker `rank`'s share of the one held-out set: the first ceil(num_tokens / S) positions
        of the eval stream (sources by weight, seeded by EVAL_SEED, never by the run), in batches
        of `batch_size` sequences dealt round-robin over the `world` workers. Every run scores
        the same sequences whatever its b and D. A worker short of a batch gets one whose loss
        mask is all zero: every rank must run the same number of forwards (ZeRO-3 gathers
        parameters in each), and a masked batch adds nothing to the loss."""
        if self.split != "eval":
            raise ValueError("eval_batches needs TokenDataset(cfg, split='eval')")
        n = max(1, -(-num_tokens // self.seq_len))
        have = np.array([i for i, s in enumerate(self.sources) if s.num_sequences > 0], np.int64)
        if not len(have):
            raise ConfigError(
                "data.eval_fraction",
                "no source has a full held-out sequence; raise data.eval_fraction or add documents",
            )
        picked, counters = mixture.assign(self.weights[have], np.arange(n))
        sources = have[picked]
        starts = list(range(0, n, batch_size))
        per_rank = -(-len(starts) // world)
        mine = starts[rank::world]
        batches = [self._gather(sources[i : i + batch_size], counters[i : i + batch_size]) for i in mine]
        if len(batches) < per_rank:
            filler = self._gather(sources[:1], counters[:1])
            filler.loss_mask.zero_()
            batches += [filler] * (per_rank - len(batches))
        return batches

    def _gather(self, sources: np.ndarray, counters: np.ndarray) -> Batch:
        """Build exactly the requested sequences, one vectorised gather per source."""
        parts, rows = [], []
        for s in np.unique(sources):
            rows.append(np.flatnonzero(sources == s))
            packed = self.sources[int(s)]
            parts.append(packed.windows(packed.sequence_index(counters[rows[-1]])))
        return _to_batch(parts, np.argsort(np.concatenate(rows)), sources)


def check_corpus(cfg: Config, tokens_per_update: int) -> None:
    """Fail in the driver, before Ray starts, on a missing, empty or too small corpus.

    Builds the token caches on the way, so the workers find them ready.
    """
    for i, src in enumerate(cfg.data.sources):
        if load_source(cfg, i).num_documents == 0:
            key, what = (
                (f"data.sources.{i}.path", f"got {src.path!r}")
                if src.kind == "files"
                else (f"data.sources.{i}", f"kind {src.kind!r}")
            )
            raise ConfigError(key, f"{what}; source {src.name!r} holds no documents (every one is empty)")
    train = TokenDataset(cfg, "train")
    for packed in train.sources:
        packed.sequence_index(np.zeros(1, np.int64))  # a one-line ConfigError if it has no sequence
    total, cap = sum(p.num_tokens for p in train.sources), cfg.data.max_documents_per_source
    if total < tokens_per_update:
        raise ConfigError(
            "data.sources",
            f"the train split of all sources holds {total:,} tokens; one update needs {tokens_per_update:,} "
            "(batch.tokens_per_update); "
            f"add documents, raise data.max_documents_per_source={cap} or lower batch.tokens_per_update",
        )
    if all(p.num_sequences == 0 for p in TokenDataset(cfg, "eval").sources):
        raise ConfigError(
            "data.eval_fraction",
            f"got {cfg.data.eval_fraction}; no source has a full held-out sequence; raise it or add documents",
        )
