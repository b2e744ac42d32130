"""GPT: document-masked causal attention, per-document positions, loss, size and FLOPs."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from orchestrator.core.schema import ModelConfig
from workloads.builtin.gpt import (
    GPT,
    HAS_FLEX,
    CausalSelfAttention,
    GPTConfig,
    count_params,
    document_mask,
    flops_per_token,
    mfu,
    num_params,
    param_groups,
    token_losses,
)

CFG = ModelConfig(n_layers=2, n_heads=4, d_model=32, mlp_ratio=4, max_seq_len=64, vocab_size=257)


def make_model(cfg: ModelConfig = CFG, seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    return GPT(cfg).eval()


def pack(*docs: torch.Tensor):
    """Pack 1-d token tensors into one sequence: (inputs, positions, doc_ids), each [1, S]."""
    inputs = torch.cat(docs)
    positions = torch.cat([torch.arange(len(d)) for d in docs])
    doc_ids = torch.cat([torch.full((len(d),), i) for i, d in enumerate(docs)])
    return inputs[None], positions[None], doc_ids[None]


def rand_tokens(n: int, seed: int) -> torch.Tensor:
    return torch.randint(0, CFG.vocab_size, (n,), generator=torch.Generator().manual_seed(seed))


def test_changing_one_document_leaves_the_others_unchanged():
    model = make_model()
    a, b, c = rand_tokens(7, 1), rand_tokens(9, 2), rand_tokens(6, 3)
    b2 = b.clone()
    b2[4:] = (b2[4:] + 1) % CFG.vocab_size  # change doc 1 from its 5th token on
    with torch.no_grad():
        before = model(*pack(a, b, c))[0]
        after = model(*pack(a, b2, c))[0]
    same = (after - before).abs().amax(dim=-1)
    doc_a, doc_b, doc_c = slice(0, 7), slice(7, 16), slice(16, 22)
    assert same[doc_a].max() < 1e-6 and same[doc_c].max() < 1e-6  # other documents: untouched
    assert same[7:11].max() < 1e-6  # doc 1 before the change: causal
    assert (same[11:16] > 1e-4).all()  # doc 1 at and after the change: different
    assert same[doc_b].max() > 1e-4


def test_positions_restart_per_document():
    model = make_model()
    x, y = rand_tokens(10, 4), rand_tokens(13, 5)
    with torch.no_grad():
        first = model(*pack(x, y))[0, :10]
        second = model(*pack(y, x))[0, 13:]
    torch.testing.assert_close(first, second, rtol=1e-5, atol=1e-5)


def test_without_restarting_positions_the_logits_differ():
    """The previous test is not vacuous: positions do matter."""
    model = make_model()
    x, y = rand_tokens(10, 4), rand_tokens(13, 5)
    inputs, positions, doc_ids = pack(y, x)
    with torch.no_grad():
        restarted = model(inputs, positions, doc_ids)[0, 13:]
        continued = model(inputs, torch.arange(23)[None], doc_ids)[0, 13:]
    assert (restarted - continued).abs().max() > 1e-3


def naive_attention(attn: CausalSelfAttention, x: torch.Tensor, doc_ids: torch.Tensor) -> torch.Tensor:
    """Softmax attention with explicit loops for the mask: j <= i and same document."""
    b, S, d = x.shape
    H, Q = attn.n_heads, d // attn.n_heads
    q, k, v = (x @ attn.c_attn.weight.T).split(d, dim=2)
    out = torch.zeros(b, S, d)
    for n in range(b):
        for h in range(H):
            cols = slice(h * Q, (h + 1) * Q)
            for i in range(S):
                allowed = [j for j in range(S) if j <= i and doc_ids[n, j] == doc_ids[n, i]]
                scores = torch.stack([q[n, i, cols] @ k[n, j, cols] for j in allowed]) / math.sqrt(Q)
                weights = torch.softmax(scores, dim=0)
                out[n, i, cols] = sum(w * v[n, j, cols] for w, j in zip(weights, allowed))
    return out @ attn.c_proj.weight.T


@pytest.fixture
def attention_case():
    torch.manual_seed(0)
    attn = CausalSelfAttention(CFG)
    x = torch.randn(2, 12, CFG.d_model)
    doc_ids = torch.tensor([[0] * 5 + [1] * 4 + [2] * 3, [7] * 12])
    return attn, x, doc_ids


def test_sdpa_mask_path_equals_naive_attention(attention_case):
    attn, x, doc_ids = attention_case
    mask = document_mask(doc_ids)
    assert mask.shape == (2, 1, 12, 12) and mask.dtype == torch.bool
    with torch.no_grad():
        torch.testing.assert_close(attn(x, mask), naive_attention(attn, x, doc_ids), rtol=1e-5, atol=1e-6)


@pytest.mark.skipif(not HAS_FLEX, reason="torch without flex attention")
def test_flex_block_mask_path_equals_naive_attention(attention_case):
    """The CUDA path's BlockMask, run eagerly on CPU: same mask semantics as the dense one."""
    attn, x, doc_ids = attention_case
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "flex_attention called without torch.compile()"
        out = attn(x, document_mask(doc_ids, fused=True))
    torch.testing.assert_close(out, naive_attention(attn, x, doc_ids), rtol=1e-5, atol=1e-6)


def test_token_losses_equals_a_loop_over_positions():
    torch.manual_seed(1)
    logits = torch.randn(3, 8, 11)
    targets = torch.randint(0, 11, (3, 8))
    loss_mask = (torch.rand(3, 8) > 0.4).float()
    targets[loss_mask == 0] = -1  # padding targets are not valid classes: must not matter
    summed, count = token_losses(logits, targets, loss_mask)
    expected, n = 0.0, 0
    for i in range(3):
        for j in range(8):
            if loss_mask[i, j]:
                expected += -torch.log_softmax(logits[i, j], dim=0)[targets[i, j]].item()
                n += 1
    assert count.item() == n
    assert summed.item() == pytest.approx(expected, rel=1e-6)


def test_masked_positions_get_no_gradient():
    logits = torch.randn(2, 5, 7, requires_grad=True)
    loss_mask = torch.tensor([[1, 1, 0, 0, 0], [1, 0, 1, 0, 0]]).float()
    summed, _ = token_losses(logits, torch.randint(0, 7, (2, 5)), loss_mask)
    summed.backward()
    assert (logits.grad[loss_mask == 0] == 0).all()
    assert (logits.grad[loss_mask == 1].abs().sum(-1) > 0).all()


def test_param_counts():
    model = make_model()
    total = sum(p.numel() for p in model.parameters())
    assert model.lm_head.weight is model.wte.weight  # tied, counted once
    assert num_params(model, exclude_embeddings=False) == total
    assert num_params(model) == total - CFG.max_seq_len * CFG.d_model
    assert count_params(CFG) == num_params(model)
    assert count_params(CFG, exclude_embeddings=False) == total


def test_flops_per_token_by_hand():
    cfg = ModelConfig(n_layers=2, n_heads=4, d_model=128, mlp_ratio=4, max_seq_len=256, vocab_size=257)
    # per block: qkv 3*128^2 + proj 128^2 + MLP 2*4*128^2 + two norms 2*128 = 196864;
    # plus final norm 128 and the tied token table 257*128 = 32896.
    n = 2 * 196864 + 128 + 32896
    assert n == 426752
    attention = 12 * 2 * 4 * 32 * 64
    assert flops_per_token(cfg, 64) == 6 * 426752 + attention == 2757120
    assert mfu(tokens_per_s=1000.0, flops_per_token=2757120, peak_flops=2.75712e10) == pytest.approx(0.1)


def test_init_is_deterministic_and_gpt2_scaled():
    a, b = make_model(seed=3), make_model(seed=3)
    for (name, p), q in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(p, q), name
    assert not torch.equal(make_model(seed=4).wte.weight, a.wte.weight)
    cfg = ModelConfig(n_layers=8, n_heads=4, d_model=256, max_seq_len=64)
    big = make_model(cfg)
    assert big.wte.weight.std().item() == pytest.approx(0.02, rel=0.05)
    assert big.blocks[0].attn.c_proj.weight.std().item() == pytest.approx(0.02 / math.sqrt(16), rel=0.05)
    assert big.blocks[0].mlp.c_proj.weight.std().item() == pytest.approx(0.02 / math.sqrt(16), rel=0.05)


def test_param_groups_cover_every_parameter_once():
    model = make_model()
    decay, no_decay = param_groups(model, weight_decay=0.1)
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    ids = [id(p) for g in (decay, no_decay) for p in g["params"]]
    assert sorted(ids) == sorted(id(p) for p in model.parameters())
    assert all(p.dim() >= 2 for p in decay["params"]) and all(p.dim() == 1 for p in no_decay["params"])
    assert any(p is model.wte.weight for p in decay["params"])
    assert len(no_decay["params"]) == 2 * CFG.n_layers + 1  # LayerNorm weights only


def test_forward_shape_and_backward():
    model = make_model().train()
    inputs, positions, doc_ids = pack(rand_tokens(20, 6), rand_tokens(12, 7))
    inputs, positions, doc_ids = (t.repeat(3, 1) for t in (inputs, positions, doc_ids))
    logits = model(inputs, positions, doc_ids)
    assert logits.shape == (3, 32, CFG.vocab_size)
    summed, count = token_losses(logits[:, :-1], inputs[:, 1:], torch.ones(3, 31))
    (summed / count).backward()
    # At init the loss is close to uniform over the vocabulary.
    assert (summed / count).item() == pytest.approx(math.log(CFG.vocab_size), rel=0.05)
    assert all(p.grad is not None for p in model.parameters())


@pytest.mark.parametrize("overrides", [[], ["model.d_model=96", "model.n_layers=3", "model.n_heads=4"]])
def test_model_params_is_what_multiplies_every_token(overrides):
    """`model.params` (the N of a ladder's laws): every parameter of the built model but the
    position table (a lookup), the tied token table once as the output head; for linear regression
    its weights."""
    from orchestrator.core import config
    from orchestrator.driver import run_life
    from tests.conftest import ROOT, TINY

    cfg = config.load(TINY, overrides)
    model = GPT(GPTConfig.of(cfg.model))
    counted = sum(p.numel() for p in model.parameters()) - model.wpe.weight.numel()
    assert run_life.run_params(cfg)["model.params"] == counted
    linreg = config.load(ROOT / "conf" / "train" / "linreg.yaml")
    assert run_life.run_params(linreg)["model.params"] == linreg.model.dim
