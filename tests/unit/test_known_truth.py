"""What the analysis concludes, on simulated training whose noise scale is known and whose curves
are not the hyperbola it fits (tests/known_truth.py: McCandlish et al.'s progress per step with a
warmup in tokens, wsd decay, noise on every logged point, seed luck, an lr grid fixed across B).

Every world goes through the tables a trainer writes (`orchestrator report DIR`'s format, read by
orchestrator/analysis/tables.py), in memory; one goes through the real command on a folder. Fixed draws.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from orchestrator import cli
from orchestrator.analysis import sweep_analysis, tables
from orchestrator.reporting import report_render
from tests.known_truth import BATCHES, World, factor_grid

LRS = factor_grid(0.001, 0.032)
"""Factor 2, the same at every B, bracketing lr_opt(B) = 0.0031 .. 0.0171 of the default world."""
DRAWS = 30


def analyse(world: World, lrs=LRS, seeds: int = 3, batches=BATCHES, **options):
    return sweep_analysis.analyse(world.trials(world.grid(batches=batches, lrs=lrs, seeds=seeds)), **options)


def covers(fit, truth: float) -> bool:
    lo, hi = fit["b_crit_interval"]
    return lo <= truth <= hi


@pytest.fixture(scope="module")
def constant_draws():
    """30 draws of a world with a constant B_noise inside the swept range (700 tokens), a warmup of
    3% of the budget, three seeds and per-update noise."""
    return [analyse(World(draw=d)).to_json() for d in range(DRAWS)]


def test_a_constant_noise_scale_is_recovered_within_20_percent_and_covered(constant_draws):
    truth = World().b_noise
    assert World().warmup_tokens / World().total_tokens == pytest.approx(0.03, abs=0.005)
    errors = [r["primary"]["b_crit"] / truth - 1 for r in constant_draws]
    covered = sum(covers(r["primary"], truth) for r in constant_draws)
    worst = max(map(abs, errors))
    print(f"B_crit / B_noise - 1: median {np.median(errors):+.3f}, worst {worst:.3f}; covered {covered}/30")
    assert all(r["primary"]["status"] == "resolved" for r in constant_draws)
    assert max(abs(e) for e in errors) < 0.2
    assert covered >= 24


def test_a_constant_noise_scale_shows_no_trend(constant_draws):
    intervals = [r["trend"]["b_crit_slope_interval"] for r in constant_draws]
    assert all(r["trend"]["targets"] and len(r["trend"]["targets"]) == 3 for r in constant_draws)
    assert sum(lo <= 0 <= hi for lo, hi in intervals) >= 24


def test_a_rising_noise_scale_gives_a_rising_b_crit():
    """B_noise rises about 4x from the start to the lowest target: the fit measures its average
    along the path, so B_crit rises as the target falls, below B_noise at the target itself."""
    world = World(rise=2.2)
    for draw in range(3):
        answer = analyse(world.with_(draw=draw))
        r = answer.to_json()
        fits = r["critical_batch"]  # lowest target first
        assert all(f["status"] == "resolved" for f in fits)
        assert fits[0]["b_crit"] > fits[-1]["b_crit"]
        lo, hi = r["trend"]["b_crit_slope_interval"]
        assert hi < 0, (lo, hi)  # log B_crit falls with log loss: it rises as the loss falls
        assert r["trend"]["agree"] and r["trend"]["b_simple_slope"] < 0
        lowest = fits[0]
        assert lowest["b_crit"] < float(world.b_noise_at(np.array([lowest["target_loss"]]))[0])
    assert "B_crit rises as the loss falls" in report_render.answer(answer)


def test_a_noise_scale_below_the_smallest_batch_is_a_bound_not_a_point():
    answer = analyse(World(b_noise=40.0), seeds=2)
    r = answer.to_json()
    for fit in r["critical_batch"]:
        assert fit["status"] == "below" and fit["b_crit"] is None and fit["b_crit_interval"] is None
        assert fit["b_crit_bound"] == BATCHES[0] and fit["b_crit_fit"] < BATCHES[0]
    assert f"B_crit < {BATCHES[0]} tokens" in report_render.answer(answer)


def test_learning_rates_all_below_the_optimum_are_flagged_as_edges():
    """lrs up to 0.008: below lr_opt at B >= 1024 (0.0119 ... 0.0171)."""
    world = World()
    answer = analyse(world, lrs=factor_grid(0.001, 0.008), seeds=2)
    r = answer.to_json()
    short = [b for b in BATCHES if world.lr_opt(b) > 0.008 * 1.2]
    assert short == [1024, 2048, 4096]
    for fit in r["critical_batch"]:
        edges = {p["batch"]: p["lr_edge"] for p in fit["points"]}
        assert all(edges[b] == "highest" for b in short), edges
        assert any("are upper bounds: the best lr there is the highest tried" in n for n in fit["notes"])
    assert all(row["lr_edge"] == "highest" for row in r["best_per_batch"] if row["batch"] in short)
    assert "The best lr is the highest tried at" in report_render.answer(answer)
    assert "search.algorithm: bracket extends it" in report_render.answer(answer)


@pytest.mark.parametrize(
    "kind, changes",
    [
        ("sharper knee", {"knee": 2.0}),
        ("softer knee", {"knee": 0.5}),
        ("heavy per-point noise", {"update_noise": 4.0}),
        ("seed noise growing with sqrt(B)", {"seed_noise": 0.03, "seed_noise_growth": 0.5}),
        ("lr response smooth in log lr", {"gain": "log"}),
    ],
)
def test_misspecified_worlds_are_covered_or_flagged(kind, changes):
    """Where the hyperbola is not the world (knees) or the noise is not the bootstrap's (per point,
    growing with B), the interval still holds B_noise, or the lack-of-fit test says not to trust it."""
    truth, draws = World().b_noise, 10
    results = [analyse(World(draw=d, **changes)).to_json() for d in range(draws)]
    covered = sum(covers(r["primary"], truth) for r in results)
    flagged = sum(any(f["lack_of_fit"]["flagged"] for f in r["critical_batch"]) for r in results)
    print(f"{kind}: covered {covered}/{draws}, lack of fit flagged {flagged}/{draws}")
    assert covered >= 0.8 * draws or flagged >= 0.8 * draws


def test_no_analysis_constant_moves_the_answer():
    """Pre-smoothing the curves (the old analysis's window, 0 to 32 updates of the largest batch)
    moves B_crit by less than its own interval; so does halving the warmup."""
    world = World(draw=3)
    base = analyse(world).primary
    lo, hi = base.b_crit_interval
    for width in (2 * 4096, 8 * 4096, 32 * 4096):
        moved = analyse(world, smoothing_tokens=width).primary.b_crit
        assert lo <= moved <= hi, (width, moved, (lo, hi))
    halved = analyse(world.with_(warmup_tokens=world.warmup_tokens // 2)).primary.b_crit
    assert lo <= halved <= hi


def test_report_of_a_table_folder_is_the_analysis_of_its_tables(tmp_path, capsys):
    """`orchestrator report DIR` on csv files a trainer wrote gives what the tables give in memory,
    and its own --out tables read back to the same answer (its output is its input)."""
    world = World(draw=1)
    runs = world.grid(batches=BATCHES[1:5], lrs=LRS[1:], seeds=2)
    folder = world.write(runs, tmp_path / "from-any-trainer")
    assert cli.main(["report", str(folder), "--out", str(tmp_path / "report")]) == 0
    written = json.loads((tmp_path / "report" / "report.json").read_text())
    direct = sweep_analysis.analyse(tables.read(folder))
    assert written["primary"]["b_crit"] == pytest.approx(direct.primary.b_crit, rel=1e-12)
    assert written["source"]["kind"] == "tables"
    assert cli.main(["report", str(tmp_path / "report"), "--out", str(tmp_path / "again")]) == 0
    again = json.loads((tmp_path / "again" / "report.json").read_text())
    assert again["primary"]["status"] == written["primary"]["status"]
    for key in ("b_crit", "b_crit_interval", "target_loss"):
        assert again["primary"][key] == pytest.approx(written["primary"][key], rel=1e-12), key
    assert (folder / "trials.csv").read_text().startswith("trial,status,"), "the input folder is not rewritten"
    assert "B_crit" in capsys.readouterr().out


def test_a_table_folder_missing_what_the_analysis_needs_is_exit_2(tmp_path, capsys):
    folder = tmp_path / "bad"
    folder.mkdir()
    (folder / "trials.csv").write_text("trial,status,optim.lr\na,FINISHED,0.001\n")
    (folder / "curves.csv").write_text("trial,metric,tokens,value\na,train/loss,0,5.5\n")
    assert cli.main(["report", str(folder), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "batch.tokens_per_update" in err[0], err
    assert not (tmp_path / "out").exists(), "nothing half-written"
