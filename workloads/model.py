"""The public path of the built-in GPT (workloads/builtin/gpt.py), for workloads of your own
that reuse its model and loss (docs/design.md 3)."""

from workloads.builtin.gpt import (  # noqa: F401
    GPT,
    HAS_FLEX,
    MLP,
    AttentionMask,
    Block,
    CausalSelfAttention,
    GPTConfig,
    activation_bytes,
    attend,
    count_params,
    document_mask,
    flops_per_token,
    mfu,
    num_params,
    param_groups,
    token_losses,
)
