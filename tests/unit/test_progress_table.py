"""The live table of a running sweep (orchestrator/driver/progress_table.ProgressTable): progress
and ETA per trial and for the sweep, pending trials and the best so far, fed fake Tune trials and
a fake clock; in a log a line per trial start and end and the table at the end, a rich Live
display on a terminal."""

import dataclasses
import io
from types import SimpleNamespace

import pytest

from orchestrator.driver import progress_table
from orchestrator.formulas import cost
from orchestrator.studies import kinds
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
    sweep = kinds.load(ROOT / "conf" / "sweep" / "demo.yaml")
    assert kinds.expand(sweep)[0].cfg.train.total_tokens == BUDGET, "the figures below assume it"
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
    # the bracket search proposes its trials as it goes: 15 is the most it may run, and before a
    # trial has ended there is no pace of whole trials to tell the sweep's ETA by
    assert lines[0] == (
        "--- sweep demo: 0 ended of up to 15, 2 running on 1.6 CPUs, 0 pending; ETA after the first trial ends ---"
    )
    assert lines[-1] == "best so far: none finished yet"


def test_the_sweep_eta_is_the_pace_of_the_trials_done(table_and_trials, capsys):
    """a ends 400 s after its start at 0 s and b has run as long: an ended trial's wall time is
    what a trial costs, start-up included, so b counts as one trial done (its share of its tokens,
    10%, is not what counts); the bracket search's 15 is a bound, so 'at most'."""
    table, clock, a, b = table_and_trials
    clock.now = 400.0
    capsys.readouterr()
    table.on_trial_result(0, [a, b], a, {"tokens": BUDGET, "loss": 2.9, "eval_loss": 2.8})
    table.on_trial_complete(0, [a, b], a)
    eta = (15 - 2) * 400 / 2  # 2 trials' worth in 400 s
    assert table.sweep_eta_s() == pytest.approx(eta)
    line = capsys.readouterr().out.splitlines()[-1]  # a line, no table
    assert line == (
        f"[ 6m 40s] done {table.rows['a']['name']} (loss 2.900, eval 2.800); sweep demo: 1 ended of up to 15, "
        f"1 running on 0.8 CPUs, 0 pending; ETA at most {cost.format_duration(eta)}"
    )


def simulated_sweep(table, clock, n=12, slots=2, start_up_s=15.0, train_s=20.0, reports=4):
    """n trials of the demo's budget, `slots` at a time, each `start_up_s` before its first result
    and `train_s` of training reported `reports` times: the sweep ends at n / slots x (start_up_s +
    train_s). Returns (the trials, each ETA the table told, with the time it told it)."""
    trials = [trial(f"t{i}", 256 * 2 ** (i % 4), 1e-3 * (1 + i // 4)) for i in range(n)]
    told, per_trial = [], start_up_s + train_s
    for wave in range(n // slots):
        ours = trials[wave * slots : (wave + 1) * slots]
        t0 = wave * per_trial
        clock.now = t0
        for t in ours:
            table.on_trial_start(0, trials[: (wave + 1) * slots], t)
        for k in range(1, reports + 1):
            clock.now = t0 + start_up_s + train_s * k / reports
            for t in ours:
                table.on_trial_result(0, trials, t, {"tokens": BUDGET * k // reports, "loss": 3.0, "eval_loss": 3.0})
            told.append((clock.now, table.sweep_eta_s()))
        for t in ours:
            table.on_trial_complete(0, trials, t)
    return trials, told


def grid_table(clock, console=None):
    """The demo's sweep searched as a grid: its trials are known in advance."""
    sweep = kinds.load(ROOT / "conf" / "sweep" / "demo.yaml")
    sweep = dataclasses.replace(sweep, search=dataclasses.replace(sweep.search, algorithm="grid"))
    return progress_table.ProgressTable(sweep, clock=clock, console=console)


def test_the_sweep_eta_holds_from_the_first_trial_end_where_start_ups_are_half_the_time():
    """12 trials, 2 at a time, 15 s of start-up and 20 s of training each: 210 s in all. Every ETA
    told from the first trial's end on lands within 15% of the sweep's real end (a token rate
    taken from the first results, start-ups left out, told 40% early)."""
    clock = Clock()
    table = grid_table(clock)
    table.setup(total_num_samples=12)
    _, told = simulated_sweep(table, clock)
    first_end = 35.0
    for now, eta in told:
        if now <= first_end:  # the results up to the first end come before it
            assert eta is None
        else:
            assert eta is not None and abs(now + eta - 210.0) <= 0.15 * 210.0, (now, eta)


def test_a_log_gets_a_line_per_trial_start_and_end_and_the_table_once_at_the_end(capsys):
    """In a log the table is not reprinted as results come: a line when a trial starts or ends,
    and the whole table once, when the sweep ends; between those lines, nothing for up to a minute."""
    clock = Clock()
    table = grid_table(clock)
    table.setup(total_num_samples=12)
    trials, _ = simulated_sweep(table, clock)
    table.on_experiment_end(trials)
    lines = capsys.readouterr().out.splitlines()
    events = [ln.split("] ")[1].split()[0] for ln in lines if ln.startswith("[")]
    assert events.count("started") == 12 and events.count("done") == 12
    assert sum(ln.startswith("--- sweep demo") for ln in lines) == 1
    table_lines = 2 + 12 + 1  # title, header, rows, best so far
    assert len(lines) == 24 + table_lines, "\n".join(lines)
    assert lines[-table_lines] == "--- sweep demo: 12/12 ended, 0 running, 0 pending; ETA 0 s ---"


def test_a_quiet_log_gets_the_sweeps_counts_once_a_minute(table_and_trials, capsys):
    table, clock, a, b = table_and_trials
    capsys.readouterr()
    for now in range(40, 200, 10):  # results every 10 s, nothing starting or ending
        clock.now = float(now)
        table.on_trial_result(0, [a, b], a, {"tokens": 16_384 + 100 * now})
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and all("sweep demo: 0 ended of up to 15, 2 running" in ln for ln in lines)
    # the last line was at 0 s (the starts): the first result more than 60 s after it, then the next
    assert [ln[:9] for ln in lines] == ["[ 1m 10s]", "[ 2m 20s]"]


def test_trial_names_are_whole_so_no_two_rows_read_the_same(capsys):
    """Two seeds of one configuration differ only at the end of their 30-character names."""
    clock = Clock()
    table = grid_table(clock)
    table.setup(total_num_samples=2)
    values = {"batch.tokens_per_update": 256, "optim.lr": 7.5e-4, "schedule.warmup_share": 0.025}
    seeds = [SimpleNamespace(trial_id=f"s{k}", config={"trial": {**values, "train.seed": k}}) for k in (0, 1)]
    for t in seeds:
        table.on_trial_start(0, seeds, t)
    capsys.readouterr()
    table.print()
    rows = last_block(capsys.readouterr().out)[2:4]
    assert rows[0].startswith("B=256 lr=7.5e-4 wu=2.5% seed=0 ") and rows[1].startswith(
        "B=256 lr=7.5e-4 wu=2.5% seed=1 "
    )


def test_pending_counts_the_bracket_searchs_created_trials_and_its_bound_ends_with_the_sweep(capsys):
    """The demo's bound is 32 trials and it ran 26: no '6 pending' while the last ones run, and
    the last table counts the trials the sweep ran."""
    clock = Clock()
    sweep = kinds.load(ROOT / "conf" / "sweep" / "demo.yaml")
    table = progress_table.ProgressTable(sweep, clock=clock)
    table.setup(total_num_samples=32)
    trials, _ = simulated_sweep(table, clock, n=26)
    c = trials[-1]
    assert table.counts() == "26 ended of up to 32, 0 running, 0 pending"
    assert table.eta().startswith("ETA at most ")
    table.on_experiment_end(trials)
    assert table.counts() == "26/26 ended, 0 running, 0 pending" and table.eta() == "ETA 0 s"
    assert c.trial_id in table.rows


def test_pending_trials_are_listed_and_the_best_finished_is_named(table_and_trials, capsys):
    """A trial Tune created but has not started has its row and is counted pending; the best
    finished trial is named below."""
    table, clock, a, b = table_and_trials
    c = trial("c", 1024, 1e-3)
    clock.now = 40.0
    table.on_trial_result(0, [a, b, c], b, {"tokens": BUDGET, "loss": 2.9, "eval_loss": 2.7})
    assert table.rows["c"]["status"] == "PENDING"
    assert table.counts() == "0 ended of up to 15, 2 running on 1.6 CPUs, 1 pending"
    table.on_trial_complete(0, [a, b, c], b)
    table.on_trial_start(0, [a, b, c], c)
    capsys.readouterr()
    table.print()
    lines = last_block(capsys.readouterr().out)
    assert line_of(lines, "B=1Ki lr=1e-3").split()[-1] == "RUNNING"
    assert lines[0].startswith("--- sweep demo: 1 ended of up to 15, 2 running on 1.6 CPUs, 0 pending; ETA at most ")
    assert lines[-1] == f"best so far: {table.rows['b']['name']}, eval 2.700"
    assert table.rows["b"]["name"].startswith("B=8Ki lr=1e-3")


def test_a_restarted_trial_measures_its_rate_again(table_and_trials):
    table, clock, a, b = table_and_trials
    table.on_trial_error(0, [a, b], b)
    assert table.rows["b"]["status"] == "ERROR"
    clock.now = 100.0
    table.on_trial_start(0, [a, b], b)  # Tune retries it from its checkpoint
    assert table.rows["b"]["rate"] is None
    table.on_trial_result(0, [a, b], b, {"tokens": 24_576})  # back at its checkpoint
    clock.now = 110.0
    table.on_trial_result(0, [a, b], b, {"tokens": 49_152})
    assert table.rows["b"]["rate"] == pytest.approx(2_457.6)


def test_on_a_terminal_the_table_refreshes_in_place_and_stops(capsys):
    from rich.console import Console

    sweep = kinds.load(ROOT / "conf" / "sweep" / "demo.yaml")
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
    assert "ETA after the" in shown  # the title wraps there
    table.on_experiment_end([a])
    assert table._live is None and progress_table._LIVE == []
    assert capsys.readouterr().out == ""  # nothing went to stdout: it all went to the console


def test_a_sweep_of_hundreds_lists_the_running_the_best_and_the_failed_and_counts_the_rest(capsys):
    """200 trials: 120 finished, 2 failed, 3 running, 75 pending. The plain table lists the 3
    running, the 5 finished with the lowest eval loss and the 2 failed (10 rows, in Tune's order),
    and counts the other 190 by status; the rich table lists the same rows."""
    sweep = kinds.load(ROOT / "conf" / "sweep" / "demo.yaml")
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
    assert lines[0].startswith("--- sweep demo: 122 ended of up to 200, 3 running")
    assert table.rich_table().row_count == 10
