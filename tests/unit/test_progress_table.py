"""The live table of a running sweep (orchestrator/driver/progress_table.ProgressTable): progress
and ETA per trial and for the sweep, pending trials and the best so far, fed fake Tune trials and
a fake clock; plain text when stdout is not a terminal, a rich Live display on one."""

import io
from types import SimpleNamespace

import pytest

from orchestrator.core import sweep_file
from orchestrator.driver import progress_table
from orchestrator.formulas import cost
from orchestrator.sweeps import search_space
from tests.conftest import ROOT

BUDGET = 327_680  # conf/sweep/demo.yaml: train.total_tokens, a whole number of updates at every B


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def trial(trial_id, batch, lr):
    values = {"batch.tokens_per_update": batch, "optim.lr": lr, "schedule.warmup_share": 0.05}
    return SimpleNamespace(trial_id=trial_id, config={"trial": values})


@pytest.fixture
def table_and_trials():
    sweep = sweep_file.load(ROOT / "conf" / "sweep" / "demo.yaml")
    assert search_space.expand(sweep)[0].cfg.train.total_tokens == BUDGET, "the figures below assume it"
    clock = Clock()
    table = progress_table.ProgressTable(sweep, clock=clock)
    table.setup(total_num_samples=15)
    a, b = trial("a", 512, 3e-4), trial("b", 8192, 1e-3)

    def result(t, at, tokens):
        clock.now = at
        table.on_trial_result(0, [a, b], t, {"tokens": tokens, "loss": 3.0, "eval_loss": None})

    clock.now = 0.0
    table.on_trial_start(0, [a, b], a)
    table.on_trial_start(0, [a, b], b)
    result(a, 10.0, 8_192)  # first results: the rates start here (start-up left out)
    result(b, 10.0, 8_192)
    result(a, 20.0, 16_384)  # 8,192 tokens in 10 s: 819.2 tokens/s
    result(b, 30.0, 32_768)  # 24,576 tokens in 20 s: 1,228.8 tokens/s
    return table, clock, a, b


def last_block(text):
    return text[text.rindex("--- sweep") :].splitlines()


def line_of(lines, name):
    (line,) = [ln for ln in lines if ln.startswith(name)]
    return line


def test_plain_table_shows_progress_and_etas(table_and_trials, capsys):
    table, clock, a, b = table_and_trials
    capsys.readouterr()
    table.print()
    lines = last_block(capsys.readouterr().out)
    # a: (327,680 - 16,384) / 819.2 = 380 s; b: (327,680 - 32,768) / 1,228.8 = 240 s
    assert cost.format_duration((BUDGET - 16_384) / 819.2) == "6m 20s"
    assert " 5% " in line_of(lines, "B=512 lr=3e-4") and "6m 20s" in line_of(lines, "B=512 lr=3e-4")
    assert " 10% " in line_of(lines, "B=8Ki lr=1e-3") and "4m 00s" in line_of(lines, "B=8Ki lr=1e-3")
    # sweep: 311,296 + 294,912 left in the two, 13 trials not created yet x 327,680, at the pace
    # kept since the first start: 16,384 + 32,768 tokens in 30 s = 1,638.4 tokens/s
    left = (BUDGET - 16_384) + (BUDGET - 32_768) + 13 * BUDGET
    assert table.remaining_tokens() == left
    assert table.sweep_rate() == pytest.approx(1_638.4)
    assert lines[0] == (
        f"--- sweep demo: 0/15 ended, 2 running on 1.6 CPUs, 13 pending; ETA {cost.format_duration(left / 1638.4)} "
        f"({left:,} tokens left at 1,638 tokens/s) ---"
    )
    assert cost.format_duration(left / 1638.4) == "49m 30s"
    assert lines[-1] == "best so far: none finished yet"


def test_a_trial_that_ends_prints_at_once_and_leaves_the_sweep_eta(table_and_trials, capsys):
    table, clock, a, b = table_and_trials
    clock.now = 25.0  # within 20 s of the last print: a result prints nothing
    capsys.readouterr()
    table.on_trial_result(0, [a, b], a, {"tokens": 24_576})
    assert capsys.readouterr().out == ""
    clock.now = 400.0
    table.on_trial_result(0, [a, b], a, {"tokens": BUDGET})
    table.on_trial_complete(0, [a, b], a)
    lines = last_block(capsys.readouterr().out)
    assert line_of(lines, "B=512 lr=3e-4").split()[-1] == "DONE"
    assert "100%" in line_of(lines, "B=512 lr=3e-4")
    # the sweep's pace does not fall to b's alone: 327,680 + 32,768 tokens in 400 s
    left = (BUDGET - 32_768) + 13 * BUDGET
    rate = (BUDGET + 32_768) / 400
    assert lines[0].startswith(
        f"--- sweep demo: 1/15 ended, 1 running on 0.8 CPUs, 13 pending; ETA {cost.format_duration(left / rate)} ("
    )
    assert cost.format_duration(left / rate) == "1h 24m"


def test_pending_trials_are_listed_and_the_eta_never_blanks(table_and_trials, capsys):
    """A trial Tune created but has not started has its row; a trial that starts (no rate of its
    own yet) leaves the sweep's ETA as it was; the best finished trial is named below."""
    table, clock, a, b = table_and_trials
    c = trial("c", 1024, 1e-3)
    clock.now = 40.0
    table.on_trial_result(0, [a, b, c], b, {"tokens": BUDGET, "loss": 2.9, "eval_loss": 2.7})
    assert table.rows["c"]["status"] == "PENDING"
    table.on_trial_complete(0, [a, b, c], b)
    before = table.sweep_eta_s()
    table.on_trial_start(0, [a, b, c], c)
    assert before is not None and table.sweep_eta_s() == pytest.approx(before)
    capsys.readouterr()
    table.print()
    lines = last_block(capsys.readouterr().out)
    assert line_of(lines, "B=1Ki lr=1e-3").split()[-1] == "RUNNING"
    assert (
        lines[0].startswith("--- sweep demo: 1/15 ended, 2 running on 1.6 CPUs, 12 pending; ETA ")
        and "ETA -" not in lines[0]
    )
    assert lines[-1] == f"best so far: {table.rows['b']['name']}, eval 2.700"
    assert table.rows["b"]["name"].startswith("B=8Ki lr=1e-3")


def test_a_restarted_trial_measures_its_rate_again(table_and_trials):
    table, clock, a, b = table_and_trials
    table.on_trial_error(0, [a, b], b)
    assert table.rows["b"]["status"] == "ERROR"
    clock.now = 100.0
    table.on_trial_start(0, [a, b], b)  # Tune retries it from its checkpoint
    assert table.rows["b"]["rate"] is None
    table.on_trial_result(0, [a, b], b, {"tokens": 24_576})  # back at the checkpoint: nothing gained
    clock.now = 110.0
    table.on_trial_result(0, [a, b], b, {"tokens": 49_152})
    assert table.rows["b"]["rate"] == pytest.approx(2_457.6)
    assert table.rows["b"]["gained"] == 32_768 + 24_576  # tokens trained twice count as trained


def test_on_a_terminal_the_table_refreshes_in_place_and_stops(capsys):
    from rich.console import Console

    sweep = sweep_file.load(ROOT / "conf" / "sweep" / "demo.yaml")
    screen = io.StringIO()
    clock = Clock()
    table = progress_table.ProgressTable(
        sweep, clock=clock, console=Console(file=screen, force_terminal=True, width=220)
    )
    table.setup(total_num_samples=2)
    a = trial("a", 512, 3e-4)
    table.on_trial_start(0, [a], a)
    for at, tokens in ((10.0, 8_192), (20.0, 16_384)):
        clock.now = at
        table.on_trial_result(0, [a], a, {"tokens": tokens, "loss": 2.5})
    assert table._live is not None and table._live in progress_table._LIVE
    shown = screen.getvalue()
    assert "B=512 lr=3e-4" in shown and "6m 20s" in shown and "2.500" in shown
    assert "ETA " + cost.format_duration((BUDGET - 16_384 + BUDGET) / 819.2) in shown
    table.on_experiment_end([a])
    assert table._live is None and progress_table._LIVE == []
    assert capsys.readouterr().out == ""  # nothing went to stdout: it all went to the console


def test_a_sweep_of_hundreds_lists_the_running_the_best_and_the_failed_and_counts_the_rest(capsys):
    """200 trials: 120 finished, 2 failed, 3 running, 75 pending. The plain table lists the 3
    running, the 5 finished with the lowest eval loss and the 2 failed (10 rows, in Tune's order),
    and counts the other 190 by status; the rich table lists the same rows."""
    sweep = sweep_file.load(ROOT / "conf" / "sweep" / "demo.yaml")
    clock = Clock()
    table = progress_table.ProgressTable(sweep, clock=clock)
    table.setup(total_num_samples=200)
    trials = [trial(f"t{i}", 256 * 2 ** (i % 6), 1e-4 * (1 + i)) for i in range(200)]
    for i, t in enumerate(trials[:125]):
        table.on_trial_start(0, trials, t)
        if i < 120:
            table.on_trial_result(
                0, trials, t, {"tokens": BUDGET, "loss": 3.0, "eval_loss": 3.0 + ((i * 37) % 120) / 100}
            )
            table.on_trial_complete(0, trials, t)
        elif i < 122:
            table.on_trial_error(0, trials, t)
    best = sorted(range(120), key=lambda i: (i * 37) % 120)[:5]
    capsys.readouterr()
    table.print()
    lines = last_block(capsys.readouterr().out)
    rows, rest = table.listed()
    expected = sorted(best + [120, 121, 122, 123, 124])
    assert [r["name"] for r in rows] == [table.rows[f"t{i}"]["name"] for i in expected]
    assert len(lines) == 2 + 10 + 2  # title, header, the rows, the count, the best so far
    assert lines[-2] == rest and rest.startswith("... 190 more not listed (115 done, 75 pending)")
    assert lines[0].startswith("--- sweep demo: 122/200 ended, 3 running")
    assert table.rich_table().row_count == 10
