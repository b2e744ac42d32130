"""Exact S x b x D x A arithmetic: every accepted input multiplies out, every rejected input
really has no decomposition (checked by brute force)."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.core.errors import ConfigError
from orchestrator.formulas import batching

sizes = st.integers(min_value=1, max_value=64)


def brute_force(seq_len, tokens, max_b, workers, accum=None):
    """All (b, A) with S*b*D*A == tokens, b <= max_b (and A fixed when given)."""
    found = []
    for b in range(1, max_b + 1):
        for a in [accum] if accum else range(1, tokens // (seq_len * workers * b) + 1):
            if seq_len * b * workers * a == tokens:
                found.append((b, a))
    return found


@settings(max_examples=300, deadline=None)
@given(seq_len=sizes, max_b=sizes, workers=sizes, seqs=st.integers(1, 512), accum=st.none() | st.integers(1, 16))
def test_accepted_inputs_multiply_out_and_rejected_have_no_split(seq_len, max_b, workers, seqs, accum):
    tokens = seq_len * seqs
    options = brute_force(seq_len, tokens, max_b, workers, accum)
    try:
        plan = batching.solve(seq_len, tokens, max_b, workers, accum)
    except ConfigError as exc:
        assert options == [], f"rejected but {options} would work"
        assert exc.key == "batch.tokens_per_update"
        return
    assert plan.seq_len * plan.micro_batch_size * plan.num_workers * plan.grad_accum_steps == tokens
    assert plan.tokens_per_update == tokens
    assert plan.micro_batch_size <= max_b
    # The documented rule: the largest feasible micro-batch (fewest accumulation steps).
    assert plan.micro_batch_size == max(b for b, _ in options)
    if accum is not None:
        assert plan.grad_accum_steps == accum


@settings(max_examples=200, deadline=None)
@given(seq_len=sizes, workers=sizes, tokens=st.integers(1, 100_000))
def test_error_names_nearest_feasible_neighbours(seq_len, workers, tokens):
    unit = seq_len * workers
    if tokens % unit == 0:
        return
    with pytest.raises(ConfigError) as info:
        batching.solve(seq_len, tokens, 8, workers)
    below, above = tokens // unit * unit, (tokens // unit + 1) * unit
    assert f"{above:,}" in str(info.value)
    if below:
        assert f"{below:,}" in str(info.value)
        assert brute_force(seq_len, below, below // unit, workers)  # really feasible
    assert brute_force(seq_len, above, above // unit, workers)


@settings(max_examples=300, deadline=None)
@given(seq_len=st.integers(1, 8), max_b=sizes, workers=st.integers(1, 8), seqs=st.integers(1, 256))
def test_min_micro_batches_splits_when_the_update_allows_it(seq_len, max_b, workers, seqs):
    """With A derived and min_micro_batches = 2 (the noise scale's small batch): the largest b
    whose split has D x A >= 2, when any split has; the plain rule otherwise (one sequence)."""
    tokens = seq_len * seqs
    options = brute_force(seq_len, tokens, max_b, workers)
    try:
        plan = batching.solve(seq_len, tokens, max_b, workers, min_micro_batches=2)
    except ConfigError:
        assert options == []
        return
    split = [(b, a) for b, a in options if workers * a >= 2]
    assert plan.tokens_per_update == tokens and plan.micro_batch_size <= max_b
    assert plan.micro_batch_size == max(b for b, _ in split or options)
    assert (plan.micro_batches_per_update >= 2) == (seqs >= 2)


@given(st.integers(1, 5000), st.integers(1, 6000))
@settings(max_examples=300, deadline=None)
def test_the_largest_divisor_under_a_bound_is_the_brute_forces(n, bound):
    assert batching.largest_divisor_at_most(n, bound) == max(b for b in range(1, min(n, bound) + 1) if n % b == 0)


def test_a_huge_batch_costs_a_square_root_of_divisions_not_the_batch(monkeypatch):
    """2^37 tokens per update (a 2^31-sequence split) is answered by trial division to the square
    root: counted here by the modulo calls, far fewer than the brute force's 2^31."""
    calls = []

    class Counted(int):
        def __mod__(self, other):
            calls.append(other)
            return int(self) % other

    micro = batching.largest_divisor_at_most(Counted(2**31 * 3), 2**31)
    assert micro == 2**31 and len(calls) <= 2**16 * 2
    plan = batching.solve(64, 2**37, None, 1)
    assert plan.micro_batch_size * plan.grad_accum_steps == 2**31


def test_a_batch_beyond_the_ceiling_is_refused_in_one_line():
    from orchestrator.core import config

    with pytest.raises(ConfigError) as refused:
        config.load(None, [f"batch.tokens_per_update={2**70}", "batch.micro_batch_size=auto"])
    assert refused.value.key == "batch.tokens_per_update"
    assert str(batching.MAX_TOKENS_PER_UPDATE) in str(refused.value)


def test_a_given_accumulation_is_kept_whatever_min_micro_batches_says():
    plan = batching.solve(128, 128 * 8, 8, 1, grad_accum_steps=1, min_micro_batches=2)
    assert (plan.micro_batch_size, plan.grad_accum_steps) == (8, 1)
    assert batching.solve(128, 128 * 8, 8, 1, min_micro_batches=2).grad_accum_steps == 2


def test_design_example():
    plan = batching.solve(4096, 16_777_216, 4, 128)
    assert (plan.micro_batch_size, plan.grad_accum_steps) == (4, 8)


def test_given_accumulation_that_does_not_fit_in_memory_is_rejected():
    with pytest.raises(ConfigError, match="b <= batch.micro_batch_size=2"):
        batching.solve(128, 128 * 16, 2, 1, grad_accum_steps=2)  # would need b=8


@settings(max_examples=200, deadline=None)
@given(seq_len=sizes, seqs=st.integers(1, 64), workers=st.integers(1, 4), budget=st.integers(1, 10**7))
def test_total_steps_whole_updates_only(seq_len, seqs, workers, budget):
    plan = batching.BatchPlan(seq_len, seqs, workers, 1)
    if budget < plan.tokens_per_update:
        with pytest.raises(ConfigError, match="train.total_tokens"):
            batching.total_steps(plan, budget)
        return
    steps = batching.total_steps(plan, budget)
    assert plan.tokens_for_steps(steps) <= budget < plan.tokens_for_steps(steps + 1)


# ---------------------------------------------------------------- batch.ramp segments


def plan_for(tokens):
    return batching.solve(16, tokens, 8, 2)


@settings(max_examples=200, deadline=None)
@given(
    steps=st.lists(st.tuples(st.integers(1, 6), st.sampled_from([32, 64, 128, 256, 512])), min_size=1, max_size=4),
    tail=st.integers(0, 2000),
    alpha=st.sampled_from([0.0, 0.5, 1.0]),
)
def test_segments_tile_the_budget_in_whole_updates(steps, tail, alpha):
    """Brute force: walking the ramp update by update (each stretch `n` updates of its B) gives
    the segments' starts, update counts and ends; the budget's remainder is dropped."""
    changes, t = [], 0
    for n, B in steps:
        changes.append((t, B))
        t += n * B
    last_start, last_b = changes[-1]
    total = last_start + steps[-1][0] * last_b + tail
    segments = batching.segments(changes, total, plan_for, alpha)
    walked, updates = [], 0
    for i, (n, B) in enumerate(steps):
        count = n if i < len(steps) - 1 else (total - last_start) // B
        walked.append((changes[i][0], changes[i][0] + count * B, updates, count, (B / steps[0][1]) ** alpha))
        updates += count
    got = [(s.start_tokens, s.end_tokens, s.start_update, s.updates) for s in segments]
    assert got == [w[:4] for w in walked]
    assert [s.lr_factor for s in segments] == pytest.approx([w[4] for w in walked])
    assert all(s.plan.tokens_per_update == B for s, (_, B) in zip(segments, changes))
    for tokens in range(0, segments[-1].end_tokens, 16):
        here = batching.segment_at(segments, tokens)
        assert here.start_tokens <= tokens < here.end_tokens


@pytest.mark.parametrize(
    "changes, total, key, words",
    [
        ([(64, 64)], 1024, "batch.ramp.0.from_tokens", "got 64; the first step is at 0"),
        ([(0, 64), (96, 128)], 1024, "batch.ramp.1.from_tokens", "(B = 64 from 0 tokens) must be whole updates: "),
        ([(0, 64), (96, 128)], 1024, "batch.ramp.1.from_tokens", "valid from_tokens 64 or 128"),
        ([(0, 64), (64, 128), (128, 256)], 1024, "batch.ramp.2.from_tokens", "valid from_tokens 192"),
        ([(0, 64), (64, 128), (32, 256)], 1024, "batch.ramp.2.from_tokens", "got 32; segment 1"),
        ([(0, 64), (128, 48)], 1024, "batch.ramp.1.tokens_per_update", "not a multiple of data.seq_len"),
        ([(0, 64), (960, 128)], 1024, "train.total_tokens", "needs at least 1,088 for one update"),
    ],
)
def test_a_ramp_that_does_not_split_names_its_step(changes, total, key, words):
    with pytest.raises(ConfigError) as error:
        batching.segments(changes, total, plan_for)
    assert error.value.key == key and words in str(error.value), str(error.value)


def test_plan_prints_the_segments_and_refuses_a_ramp_that_does_not_split(capsys):
    from orchestrator.cli import main
    from tests.conftest import TINY

    ramp = "batch.ramp=[{from_tokens: 0, tokens_per_update: 1024}, {from_tokens: 8192, tokens_per_update: 4096}]"
    assert main(["plan", str(TINY), ramp, "batch.ramp_lr_scaling=sqrt"]) == 0
    out = capsys.readouterr().out
    assert "ramp from 0 tokens" in out and "ramp from 8,192 tokens       B 4,096 (b 8 x A 4), 62 updates, lr x 2" in out
    assert main(["plan", str(TINY), ramp.replace("8192", "8000")]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "batch.ramp.1.from_tokens: got 8,000" in line and "valid from_tokens 7,168 or 8,192" in line


def test_plan_and_the_dry_run_show_a_schedules_steps_against_its_first_batch_fixed(tmp_path, capsys):
    """A ramp 256 -> 1,024 over 49,152 tokens: 16 + 44 updates (4,096 / 256 and 45,056 / 1,024)
    against 192 at a fixed 256; adaptive from 256 up to 1,024 on linear regression (76,800
    examples): at best 4 updates of 256, 4 of 512 (to 3,072), then 72 of 1,024 = 80 against 300,
    a prediction; the wall time the same for both (the cost model counts tokens). `sweep
    --dry-run` says the same per trial."""
    from orchestrator.cli import main
    from orchestrator.core import config
    from orchestrator.driver import plan
    from tests.conftest import ROOT, TINY, write_sweep

    ramp = "batch.ramp=[{from_tokens: 0, tokens_per_update: 256}, {from_tokens: 4096, tokens_per_update: 1024}]"
    tiny = ["data.seq_len=64", "model.max_seq_len=64", "train.total_tokens=49152"]
    info = plan.describe(config.load(TINY, [*tiny, ramp]))["against_fixed"]
    assert (info["steps"], info["fixed_steps"], info["prediction"]) == (16 + 44, 192, None)
    assert info["wall_s"] == info["fixed_wall_s"] > 0
    assert plan.describe(config.load(TINY, tiny))["against_fixed"] is None
    linreg = config.load(
        ROOT / "conf" / "train" / "linreg.yaml", ["batch.schedule=adaptive", "batch.max_tokens_per_update=1024"]
    )
    info = plan.describe(linreg)["against_fixed"]
    assert (info["steps"], info["fixed_steps"]) == (80, 300)
    assert info["prediction"] == [(0, 256), (1024, 512), (3072, 1024)]
    assert (
        main(
            [
                "plan",
                str(ROOT / "conf" / "train" / "linreg.yaml"),
                "batch.schedule=adaptive",
                "batch.max_tokens_per_update=1024",
            ]
        )
        == 0
    )
    assert "predicted: 80 (-73%; B 1,024 from 3,072 tokens" in capsys.readouterr().out

    overrides = {"data.seq_len": 64, "model.max_seq_len": 64, "train.total_tokens": 49152}
    path = write_sweep(
        tmp_path,
        space={
            "batch.ramp": {
                "grid": [
                    [{"from_tokens": 0, "tokens_per_update": 256}, {"from_tokens": 4096, "tokens_per_update": 1024}]
                ]
            }
        },
        base={"config": str(TINY), "overrides": overrides},
    )
    assert main(["sweep", str(path), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert (
        "optimizer steps vs fixed: 60 with the ramp against 192 at a fixed 256 over the same 49,152 tokens (-69%)"
        in out
    )


@pytest.mark.parametrize("decay", ["wsd", "cosine", "linear", "constant"])
def test_plan_counts_the_decays_own_updates(decay):
    """The updates whose lr the decay sets, counted by brute force on the schedule itself: each
    update's lr is the schedule's where it ends; the decay's are those after warmup below the peak."""
    from orchestrator.core import config
    from orchestrator.driver import plan
    from orchestrator.formulas.schedules import lr_at
    from tests.conftest import TINY

    cfg = config.load(TINY, [f"schedule.decay={decay}", "schedule.wsd_decay_share=0.25"])
    info = plan.describe(cfg)
    b, s = info["tokens_per_update"], cfg.schedule
    ends = [b * k for k in range(1, info["total_steps"] + 1)]
    kwargs = dict(peak=1.0, total_tokens=info["total_tokens"], warmup_tokens=s.warmup_tokens, decay=decay)
    falling = sum(t > s.warmup_tokens and lr_at(t, **kwargs, wsd_decay_share=0.25) < 1.0 for t in ends)
    assert info["decay_steps"] == falling
    if decay == "wsd":
        assert info["decay_steps"] < info["total_steps"] - info["warmup_steps"]
