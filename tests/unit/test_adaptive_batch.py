"""The adaptive batch rule (orchestrator/formulas/adaptive_batch.py): doubling after `patience`
updates at or above the threshold, never past the cap, reset by a reading below or a missing one,
and its state through JSON (the checkpoint)."""

from __future__ import annotations

from orchestrator.formulas import adaptive_batch as ab

CAP_2048 = ab.AdaptiveRule(max_tokens_per_update=2048)


def run(readings, batch=256, rule=CAP_2048):
    """Feed one reading per update of `batch` tokens; the batch each update trained at."""
    state, tokens, trained = ab.AdaptiveState([(0, batch)]), 0, []
    for reading in readings:
        trained.append(batch)
        tokens += batch
        batch = ab.decide(rule, state, tokens, batch, reading) or batch
    return trained, state


def test_it_doubles_after_patience_readings_in_a_row_and_one_low_reading_resets_the_count():
    trained, state = run([600, 600, 600, 400, 600, 600, 600, 600, 600])
    assert trained == [256] * 8 + [512]  # 600 >= 2 x 256 four times in a row first after the 8th update
    trained, state = run([600] * 4 + [1100] * 4 + [1100])
    assert trained == [256] * 4 + [512] * 4 + [1024]
    assert state.ramp == [(0, 256), (4 * 256, 512), (4 * 256 + 4 * 512, 1024)]


def test_never_past_the_cap_and_a_missing_reading_counts_as_low():
    trained, _ = run([1e9] * 30, rule=ab.AdaptiveRule(max_tokens_per_update=1024))
    assert max(trained) == 1024
    trained, _ = run([600, 600, float("nan"), 600, 600, None, 600, 600, 600, 600])
    assert trained == [256] * 10


def test_calibration_scales_the_noise_scale():
    trained, _ = run([300] * 5, rule=ab.AdaptiveRule(max_tokens_per_update=2048, calibration=2.0))
    assert trained == [256] * 4 + [512]


def test_the_state_goes_through_json_unchanged():
    _, state = run([600] * 6)
    again = ab.AdaptiveState.from_json(state.to_json())
    assert again == state and ab.AdaptiveState.from_json(None) == ab.AdaptiveState()


def test_a_doubling_waits_for_whole_updates_of_the_new_batch():
    """Ready after 5 updates of 256 (1,280 tokens, not whole updates of 512): it doubles one
    update later, at 1,536, the count held through the wait; a low reading then resets it."""
    trained, state = run([100] + [600] * 6)
    assert trained == [256] * 6 + [512] and state.ramp == [(0, 256), (1536, 512)]
    trained, _ = run([100] + [600] * 4 + [100, 600])
    assert trained == [256] * 7


def test_the_fastest_ramp_doubles_after_patience_updates_at_each_batch_up_to_the_cap():
    """Always past the threshold: 4 updates of 256 (to 1,024), 4 of 512 (to 3,072), then 1,024 up
    to the cap (at 8,192: 7,168 is not whole updates of 2,048), as `run` gives with a reading past
    every threshold; none where the budget has no update of the new batch left."""
    assert ab.fastest_ramp(CAP_2048, 256, 10**6) == [(0, 256), (1024, 512), (3072, 1024), (8192, 2048)]
    assert ab.fastest_ramp(CAP_2048, 256, 10**6) == run([1e9] * 30)[1].ramp
    assert ab.fastest_ramp(CAP_2048, 256, 3072 + 1024 - 1) == [(0, 256), (1024, 512)]
