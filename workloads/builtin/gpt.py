"""Decoder-only transformer over packed sequences, with document-masked causal attention.

A packed sequence holds several documents back to back. Each token carries its document id
and its position inside that document (restarting at 0), and query i attends to key j iff
j <= i and both belong to the same document: the block-diagonal causal mask of docs/design.md 4.3.

Choices, in the spirit of nanoGPT's model.py:
- pre-norm blocks with LayerNorm without bias (GPT-2's norm; no biases anywhere else either);
- learned absolute position embeddings, indexed by the per-document positions;
- token embedding tied to the output head; GELU MLP; no dropout;
- GPT-2 init: N(0, 0.02), residual output projections N(0, 0.02 / sqrt(2 n_layers)).

Attention goes through `scaled_dot_product_attention` with a dense boolean [b, 1, S, S] mask
on CPU; on CUDA through compiled flex attention with a block mask, which never builds S x S.

The file stands alone (torch only): its shape is a GPTConfig, which the `gpt` workload
(workloads/workload.py) builds from the orchestrator's `model.*` keys.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, fields
from typing import Any, Dict, List, Tuple, Union

import torch
import torch.nn as nn
import torch.nn.functional as F

try:  # flex attention (torch >= 2.5); without it every device uses the dense mask
    from torch.nn.attention.flex_attention import BlockMask, create_block_mask, flex_attention
except ImportError:  # pragma: no cover - depends on the torch build
    BlockMask = None  # type: ignore[assignment,misc]
    flex_attention = None  # type: ignore[assignment]

HAS_FLEX = flex_attention is not None
AttentionMask = Union[torch.Tensor, "BlockMask"]


# ---------------------------------------------------------------- the shape


@dataclass(frozen=True)
class GPTConfig:
    """The hyperparameters that fix the model's shape."""

    n_layers: int = 2
    """Transformer blocks."""
    n_heads: int = 4
    """Attention heads; must divide d_model."""
    d_model: int = 128
    """Residual stream width."""
    mlp_ratio: int = 4
    """MLP hidden width as a multiple of d_model."""
    max_seq_len: int = 256
    """Positions the model can embed."""
    vocab_size: int = 257
    """Vocabulary size (257: 256 bytes + EOS)."""

    @classmethod
    def of(cls, shape: Any) -> "GPTConfig":
        """A GPTConfig from any object with these fields as attributes (e.g. a config section)."""
        if isinstance(shape, cls):
            return shape
        given = {f.name: getattr(shape, f.name) for f in fields(cls)}
        return cls(**{k: v for k, v in given.items() if v is not None})  # None: this file's default


# ---------------------------------------------------------------- the document mask


def document_mask(doc_ids: torch.Tensor, fused: bool = False) -> AttentionMask:
    """The block-diagonal causal mask for doc_ids [b, S]: True where query i may see key j.

    fused=False: a dense boolean [b, 1, S, S] tensor for scaled_dot_product_attention.
    fused=True: a flex-attention BlockMask, evaluated block by block from doc_ids, so memory
    stays O(S) and fully masked blocks (other documents) are skipped, not computed.
    """
    b, S = doc_ids.shape
    if not (fused and HAS_FLEX):
        causal = torch.ones(S, S, dtype=torch.bool, device=doc_ids.device).tril()
        same_doc = doc_ids[:, :, None] == doc_ids[:, None, :]
        return (same_doc & causal)[:, None]

    def mask_mod(batch, head, q_idx, kv_idx):  # noqa: ANN001 - flex attention's signature
        return (q_idx >= kv_idx) & (doc_ids[batch, q_idx] == doc_ids[batch, kv_idx])

    # Compiling the mask construction matters on GPU (it is rebuilt every batch); on CPU
    # (tests) the eager version is exact and avoids a C++ toolchain.
    return create_block_mask(mask_mod, B=b, H=None, Q_LEN=S, KV_LEN=S, device=doc_ids.device, _compile=doc_ids.is_cuda)


@functools.lru_cache(maxsize=None)
def _compiled_flex_attention():
    # Eager flex attention materialises the scores; only the compiled kernel is fused.
    return torch.compile(flex_attention, dynamic=False)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: AttentionMask) -> torch.Tensor:
    """Masked attention of q, k, v [b, heads, S, head_dim] under a document_mask()."""
    if isinstance(mask, torch.Tensor):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    flex = _compiled_flex_attention() if q.is_cuda else flex_attention
    return flex(q, k, v, block_mask=mask)


# ---------------------------------------------------------------- the model


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        assert cfg.d_model % cfg.n_heads == 0
        self.n_heads = cfg.n_heads
        self.c_attn = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=False)
        self.c_proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor, mask: AttentionMask) -> torch.Tensor:
        b, S, d = x.shape
        q, k, v = self.c_attn(x).split(d, dim=2)
        # [b, S, d] -> [b, heads, S, head_dim]
        q, k, v = (t.view(b, S, self.n_heads, d // self.n_heads).transpose(1, 2) for t in (q, k, v))
        y = attend(q, k, v, mask)
        return self.c_proj(y.transpose(1, 2).contiguous().view(b, S, d))


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(cfg.d_model, cfg.mlp_ratio * cfg.d_model, bias=False)
        self.c_proj = nn.Linear(cfg.mlp_ratio * cfg.d_model, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(F.gelu(self.c_fc(x)))


class Block(nn.Module):
    """Pre-norm: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.d_model, bias=False)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.d_model, bias=False)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor, mask: AttentionMask) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x), mask)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig):
        """cfg: a GPTConfig, or anything GPTConfig.of accepts."""
        super().__init__()
        self.cfg = cfg = GPTConfig.of(cfg)
        self.wte = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.wpe = nn.Embedding(cfg.max_seq_len, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(cfg.d_model, bias=False)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # tied: one matrix reads and writes tokens
        self.apply(self._init_weights)
        # GPT-2: each block adds two projections to the residual stream; scaling them keeps
        # the stream's variance from growing with depth.
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layers))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, inputs: torch.Tensor, positions: torch.Tensor, doc_ids: torch.Tensor) -> torch.Tensor:
        """inputs, positions, doc_ids: int64 [b, S] -> logits [b, S, vocab_size]."""
        mask = document_mask(doc_ids, fused=inputs.is_cuda and HAS_FLEX)  # shared by all layers
        x = self.wte(inputs) + self.wpe(positions)
        for block in self.blocks:
            x = block(x, mask)
        return self.lm_head(self.ln_f(x))


# ---------------------------------------------------------------- loss, size, FLOPs


def token_losses(
    logits: torch.Tensor, targets: torch.Tensor, loss_mask: torch.Tensor
) -> Tuple[torch.Tensor, torch.Tensor]:
    """(summed cross-entropy over loss-bearing positions, number of such positions).

    The sum, not the mean: the trainer divides by the update's global real-token count, so
    every real token weighs the same however the update is split (docs/design.md 4.2).
    """
    mask = loss_mask.reshape(-1).to(torch.float32)
    # Masked targets may hold anything (e.g. -1 for padding): point them at a valid class so
    # the per-position loss stays finite, then multiply by 0 so they add exactly nothing.
    safe_targets = targets.reshape(-1).masked_fill(mask == 0, 0)
    per_token = F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), safe_targets, reduction="none")
    return (per_token * mask).sum(), mask.sum()


def num_params(model: nn.Module, exclude_embeddings: bool = True) -> int:
    """Parameter count (tied weights once). exclude_embeddings drops the position table.

    The token table stays: it is tied to the output head, whose matmul costs compute like any
    other weight (nanoGPT's convention for the 6N FLOPs estimate).
    """
    n = sum(p.numel() for p in model.parameters())
    if exclude_embeddings and hasattr(model, "wpe"):
        n -= model.wpe.weight.numel()
    return n


def count_params(cfg: GPTConfig, exclude_embeddings: bool = True) -> int:
    """num_params(GPT(cfg)) without building the model."""
    cfg = GPTConfig.of(cfg)
    d, f = cfg.d_model, cfg.mlp_ratio * cfg.d_model
    per_block = 4 * d * d + 2 * d * f + 2 * d  # qkv + proj, MLP, two LayerNorm weights
    n = cfg.n_layers * per_block + d + cfg.vocab_size * d  # final norm, tied token table
    return n if exclude_embeddings else n + cfg.max_seq_len * d


def flops_per_token(cfg: GPTConfig, seq_len: int) -> float:
    """Training FLOPs per token: 6N + 12 L H Q T (PaLM appendix B, nanoGPT's estimate_mfu).

    6N: forward + backward matmuls against the weights. 12 L H Q T: attention scores and
    values over a full causal window T = seq_len; document masking skips some of that work,
    which this estimate (like everyone's) ignores.
    """
    cfg = GPTConfig.of(cfg)
    L, H, Q = cfg.n_layers, cfg.n_heads, cfg.d_model // cfg.n_heads
    return 6.0 * count_params(cfg) + 12.0 * L * H * Q * seq_len


def activation_bytes(cfg: GPTConfig, seq_len: int, dtype_bytes: int, dense_mask: bool) -> float:
    """Bytes autograd keeps for backward per sequence of a micro-batch (multiply by b).

    Per block, 17 tensors of [S, d] (Korthikanti et al. 2022 count 34 bytes in 16-bit): the
    norms' inputs and outputs (4), q, k and v (3), the attention output and its contiguous
    copy (2), the MLP's hidden layer before and after GELU (4 + 4); and attention's fp32
    log-sum-exp per head and query (the fused kernels keep no S x S scores). At the top, the
    final norm's input and output, and [S, vocab] logits: in the model's dtype when that is not
    fp32, then fp32 logits, log-softmax and its gradient. `dense_mask` (CPU): the boolean
    S x S document mask.
    """
    cfg = GPTConfig.of(cfg)
    S, d, V = seq_len, cfg.d_model, cfg.vocab_size
    per_block = 17 * S * d * dtype_bytes + cfg.n_heads * S * 4
    top = 2 * S * d * dtype_bytes + S * V * (12 + (dtype_bytes if dtype_bytes != 4 else 0))
    return cfg.n_layers * per_block + top + (S * S if dense_mask else 0)


def mfu(tokens_per_s: float, flops_per_token: float, peak_flops: float) -> float:
    """Model FLOPs utilisation: achieved training FLOP/s over the hardware's peak FLOP/s."""
    return tokens_per_s * flops_per_token / peak_flops


def param_groups(model: nn.Module, weight_decay: float) -> List[Dict]:
    """AdamW groups: decay every matrix (dim >= 2, the tied embedding included, as in nanoGPT
    and GPT-2); no decay for vectors (LayerNorm weights, biases), which set scales, not features."""
    params = [p for p in model.parameters() if p.requires_grad]
    return [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
