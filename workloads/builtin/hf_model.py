"""`hf`: a Hugging Face transformers causal LM, built fresh from its config class (no weights are
downloaded), trained on the same packed documents as `gpt`.

The shape comes from the orchestrator's `model.*` keys (n_layers, n_heads, d_model, mlp_ratio,
max_seq_len, vocab_size), the architecture and any other key of its config class from
`model.hf`. Document masking is kept: positions restart at every document (`position_ids`) and a
4-D block-diagonal causal mask [b, 1, S, S] (workloads/builtin/gpt.py: document_mask) keeps attention
inside documents, which transformers' SDPA attention takes as it is.
"""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

import torch
from torch import nn

from orchestrator.core.errors import ConfigError
from orchestrator.core.schema import Config
from orchestrator.formulas.batching import BatchPlan
from orchestrator.formulas.memory import ModelCosts
from workloads.train.checkpoint import load_weights
from workloads.workload import TEXT_KEYS, check_text_run


def hf_config(cfg: Config):
    """The transformers config of model.hf.architecture with the config's shape."""
    try:
        from transformers import AutoConfig
    except ImportError:
        raise ConfigError("model.name", "got 'hf'; it needs the hf extra: pip install -e '.[hf]'") from None
    m = cfg.model
    shape = {
        "vocab_size": m.vocab_size,
        "hidden_size": m.d_model,
        "intermediate_size": m.mlp_ratio * m.d_model,
        "num_hidden_layers": m.n_layers,
        "num_attention_heads": m.n_heads,
        "max_position_embeddings": m.max_seq_len,
    }
    try:
        default = AutoConfig.for_model(m.hf.architecture)
    except ValueError:
        raise ConfigError(
            "model.hf.architecture",
            f"got {m.hf.architecture!r}; not a transformers model type (e.g. llama, gpt_neox, qwen2)",
        ) from None
    unknown = [k for k in m.hf.extra if not hasattr(default, k)]
    if unknown:
        raise ConfigError("model.hf.extra", f"got {unknown[0]!r}; not a key of {type(default).__name__}")
    return AutoConfig.for_model(m.hf.architecture, **{**shape, **m.hf.extra})


def build_model(cfg: Config) -> nn.Module:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_config(hf_config(cfg), attn_implementation="sdpa", dtype=torch.float32)


class HFWorkload:
    """`hf`: the causal LM of model.hf over the packed documents of workloads/text/packing.py."""

    config_keys = ("model.hf.", *TEXT_KEYS)

    def __init__(self, cfg: Config, plan: BatchPlan, device: torch.device):
        from workloads.builtin import gpt
        from workloads.text.packing import TokenDataset

        self._gpt = gpt
        self.cfg, self.plan, self.device = cfg, plan, device
        self.model: nn.Module = build_model(cfg)
        if cfg.model.init_from:
            load_weights(self.model, cfg.model.init_from)
        self.train_data = TokenDataset(cfg, "train")
        self.eval_data = TokenDataset(cfg, "eval")
        self.source_names = [s.name for s in cfg.data.sources]
        self.flops_per_token = self.costs(cfg).flops_per_token

    @staticmethod
    def costs(cfg: Config) -> ModelCosts:
        """Parameters from the model built on the meta device; FLOPs 6N + 12 L H Q S with N the
        weights that multiply activations (an untied input embedding is a lookup, not a matmul);
        activations estimated for a Llama-like block: the residual stream's norms, q, k, v, the
        rotated q and k, the attention output and the output projection's input (10 [S, d]), and
        the gated MLP's gate, up, activation and product (4 [S, intermediate]); then the logits."""
        with torch.device("meta"):
            model = build_model(cfg)
        params = sum(p.numel() for p in model.parameters())
        embedding = model.get_input_embeddings().weight
        tied = model.get_output_embeddings() is not None and model.get_output_embeddings().weight is embedding
        m, S = cfg.model, cfg.data.seq_len
        matmul_params = params - (0 if tied else embedding.numel())
        flops = 6.0 * matmul_params + 12.0 * m.n_layers * m.d_model * S
        dtype_bytes = 4 if cfg.deepspeed.precision == "fp32" else 2
        per_block = (10 * m.d_model + 4 * m.mlp_ratio * m.d_model) * S * dtype_bytes + m.n_heads * S * 4
        top = 2 * S * m.d_model * dtype_bytes + S * m.vocab_size * (12 + (dtype_bytes if dtype_bytes != 4 else 0))
        activations = m.n_layers * per_block + top + S * S  # the dense document mask
        return ModelCosts(params, flops, float(activations), compute_params=matmul_params)

    @staticmethod
    def preflight(cfg: Config, plan: BatchPlan) -> None:
        check_text_run(cfg, plan, lambda: build_model(cfg))

    @staticmethod
    def export(cfg: Config, state_dict: Dict[str, Any], folder) -> None:
        """`orchestrator export`: a folder transformers' `from_pretrained` loads (config.json and
        model.safetensors)."""
        model = build_model(cfg)
        model.load_state_dict(state_dict, strict=True)
        model.save_pretrained(str(folder))

    def param_groups(self) -> List[Dict[str, Any]]:
        return self._gpt.param_groups(self.model, self.cfg.optim.weight_decay)

    def _wrap(self, batch):
        from workloads.workload import token_micro_batch

        return token_micro_batch(batch, self.source_names, self.device)

    def micro_batch(self, first: int, plan, rank: int, accum_step: int):
        return self._wrap(self.train_data.micro_batch(first, plan, rank, accum_step))

    def summed_loss(self, engine: nn.Module, mb) -> Tuple[torch.Tensor, torch.Tensor]:
        t = mb.tensors
        mask = self._gpt.document_mask(t["doc_ids"])  # [b, 1, S, S] bool: True where attention may look
        logits = engine(input_ids=t["inputs"], position_ids=t["positions"], attention_mask=mask).logits
        return self._gpt.token_losses(logits, t["targets"], t["loss_mask"])

    def eval_batches(self, rank: int, world: int):
        batches = self.eval_data.eval_batches(self.cfg.train.eval_tokens, self.plan.micro_batch_size, rank, world)
        return [self._wrap(b) for b in batches]
