"""GroupedASHA: Ray Tune's own ASHA, one per group of comparable trials, fed the results a sweep
over two batch sizes produces (eval loss at token rungs)."""

from types import SimpleNamespace

from ray.tune.schedulers import AsyncHyperBandScheduler, TrialScheduler

from orchestrator.studies.grouped_asha import GroupedASHA

ASHA = dict(time_attr="tokens", metric="eval_loss", mode="min", max_t=65536, grace_period=8192, reduction_factor=2)
KEYS = ("batch.tokens_per_update",)


def trial(trial_id, batch, lr):
    """What ASHA reads of a Tune trial: its id, and (for the groups) the sampled values."""
    return SimpleNamespace(trial_id=trial_id, config={"trial": {"batch.tokens_per_update": batch, "optim.lr": lr}})


# eval loss at the rungs 8,192 / 16,384 / 32,768 tokens: the large batch has taken 64x fewer
# steps and is behind at every rung, but ends best (as linear regression does at a constant lr).
CURVES = {
    ("small-a", 16, 0.03): [0.533, 0.546, 0.546, 0.562],
    ("small-b", 16, 0.10): [0.566, 0.672, 0.638, 0.654],
    ("large-a", 1024, 0.03): [0.603, 0.529, 0.508, 0.502],
    ("large-b", 1024, 0.10): [0.577, 0.538, 0.514, 0.512],
}
RUNGS = [8192, 16384, 32768, 65536]


def play(scheduler):
    """The small-batch trials reach every rung first (as when they start first); returns the
    rung at which each trial was stopped early (a STOP at max_t is the normal end)."""
    trials = {key: trial(*key) for key in CURVES}
    for t in trials.values():
        scheduler.on_trial_add(None, t)
    stopped = {}
    for key in sorted(CURVES, key=lambda k: k[1]):  # small batch first, one trial at a time
        for rung, loss in zip(RUNGS, CURVES[key]):
            action = scheduler.on_trial_result(None, trials[key], {"tokens": rung, "eval_loss": loss})
            if action == TrialScheduler.STOP:
                if rung < ASHA["max_t"]:
                    stopped[key[0]] = rung
                break
    return stopped


def test_one_asha_for_all_batch_sizes_culls_the_large_batch_that_ends_best():
    """The defect the groups fix, shown with Ray's plain ASHA."""
    assert play(AsyncHyperBandScheduler(**ASHA))["large-a"] == 8192


def test_grouped_asha_compares_only_within_a_batch_size():
    scheduler = GroupedASHA(KEYS, **ASHA)
    stopped = play(scheduler)
    assert "large-a" not in stopped and "small-a" not in stopped  # the best of each batch size runs to the end
    assert stopped == {"small-b": 8192, "large-b": 16384}  # each beaten by its own batch size's other lr
    assert scheduler.stopped_at == {"small-b": 8192, "large-b": 16384}


def test_a_group_of_one_trial_is_never_stopped():
    scheduler = GroupedASHA(KEYS, **ASHA)
    lone = trial("lone", 4096, 0.01)
    scheduler.on_trial_add(None, lone)
    for rung, loss in zip(RUNGS, [9.0, 8.0, 7.0]):
        assert scheduler.on_trial_result(None, lone, {"tokens": rung, "eval_loss": loss}) == TrialScheduler.CONTINUE
    assert (
        scheduler.on_trial_result(None, lone, {"tokens": 65536, "eval_loss": 6.0}) == TrialScheduler.STOP
    )  # max_t: done
    assert scheduler.stopped_at == {}
