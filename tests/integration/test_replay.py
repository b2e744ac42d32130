"""A replay sweep (`replay: {tables: DIR}`, orchestrator/driver/replay.py): every trial serves a
recorded run of a known-truth world's tables (tests/known_truth.py) through Ray Tune and MLflow
instead of training, and the sweep's report says what `report DIR` says of the same tables, to the
printed digits (and so does a later `report` of the sweep, from its one table of curves). How a
trial serves its run (exactly, step by step; refused off the tables) is tested without Ray below
it."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import yaml

from orchestrator.analysis import tables
from orchestrator.core import config
from orchestrator.core.errors import ConfigError
from orchestrator.core.sweep_schema import ReplayConfig, Sweep
from orchestrator.driver import replay
from orchestrator.tracking import run_tags
from orchestrator.tracking.store import Store
from tests.conftest import ROOT, run_main, sqlite_store
from tests.known_truth import World, write_tables

WORLD = World(draw=1)
BATCHES, LRS = (256, 512, 1024), (0.002, 0.004, 0.008, 0.016)


def recorded_tables(folder):
    return WORLD.write(WORLD.grid(batches=BATCHES, lrs=LRS, seeds=1), folder)


def served_pieces(folder, values):
    """What serve logs (each piece) and reports for `values`, in order."""
    sweep = Sweep(path=folder.parent / "sweep.yaml", replay=ReplayConfig(str(folder)))
    logged, reported = [], []
    replay.serve(values, sweep, logged.append, reported.append)
    return logged, reported


def key(batch, lr, seed=0):
    return {
        "batch.tokens_per_update": batch,
        "optim.lr": lr,
        "train.seed": seed,
        "train.total_tokens": WORLD.total_tokens,
    }


def test_a_recorded_run_is_served_exactly_and_a_config_off_the_tables_is_refused(tmp_path):
    """The served pieces put together are the recorded curves, value for value; each report to Tune
    follows the pieces up to its evaluation and carries that evaluation's loss; an lr the tables do
    not hold, and tables that repeat a run, are refused naming why."""
    folder = recorded_tables(tmp_path / "tables")
    (run,) = [t for t in tables.read(folder) if t.batch == 512 and t.lr == pytest.approx(0.004)]
    logged, reported = served_pieces(folder, key(512, 0.004000000000001))  # a YAML float's last bits
    for metric, field in tables.METRICS.items():
        pieces = [p for piece in logged for p in piece.get(metric, [])]
        assert pieces == list(getattr(run, field)), metric
    assert [(r["tokens"], r["eval_loss"]) for r in reported] == list(run.eval)
    assert all(r["step"] == r["tokens"] // 512 for r in reported)
    for i, r in enumerate(reported):  # what Tune hears at an evaluation was logged before it
        seen = [t for piece in logged[: i + 1] for t, _ in piece.get("train/loss", [])]
        assert max(seen) <= r["tokens"] < min([t for t, _ in run.train if t > max(seen)] or [math.inf])

    # served again into a run that holds the first pieces (a retried trial): each step once
    held = {m: max(t for t, _ in pts) for m, pts in logged[0].items()}
    again = [replay.unlogged(piece, held) for piece in logged]
    for metric, field in tables.METRICS.items():
        pieces = [p for piece in logged[:1] + again for p in piece.get(metric, [])]
        assert pieces == list(getattr(run, field)), metric

    with pytest.raises(replay.NotRecorded, match="optim.lr=0.064.*12 runs"):
        served_pieces(folder, key(512, 0.064))
    rows = (folder / "trials.csv").read_text().splitlines()
    (folder / "trials.csv").write_text("\n".join(rows + [rows[1].replace("B=", "again B=", 1)]) + "\n")
    replay.recorded.cache_clear()
    with pytest.raises(ConfigError, match="share"):
        served_pieces(folder, key(512, 0.004))


def test_a_config_between_recorded_runs_is_interpolated_and_none_is_extrapolated(tmp_path):
    """Inside the grid of recorded (log B, log lr), the final loss is the linear interpolant over
    its triangulation (scipy's griddata, computed here from the runs' own final losses) and the
    nearest run's curves are served scaled to it; outside it, and in a triangle with a run that
    failed (B = 256 at lr 0.016 diverged), the trial is refused."""
    from scipy.interpolate import griddata

    folder = recorded_tables(tmp_path / "tables")
    runs = tables.read(folder)
    finished = [t for t in runs if t.status == "FINISHED"]
    batch, lr = 700, 0.0052  # between B 512 and 1,024, lr 0.004 and 0.008; nearest 512, 0.004
    expected = griddata(
        np.log([(t.batch, t.lr) for t in finished]),
        [t.eval[-1][1] for t in finished],
        [(math.log(batch), math.log(lr))],
        method="linear",
    )[0]
    sweep = Sweep(path=tmp_path / "sweep.yaml", replay=ReplayConfig(str(folder)))
    served = replay.find(key(batch, lr), sweep)
    (nearest,) = [t for t in runs if (t.batch, t.lr) == (512, pytest.approx(0.004))]
    assert served.run.name == nearest.name and "interpolated" in served.note
    logged, reported = served_pieces(folder, key(batch, lr))
    assert reported[-1]["eval_loss"] == pytest.approx(expected, rel=1e-12)
    served_train = [p for piece in logged for p in piece.get("train/loss", [])]
    assert [t for t, _ in served_train] == [t for t, _ in nearest.train]
    assert [v for _, v in served_train] == pytest.approx([v * served.scale for _, v in nearest.train], rel=1e-12)
    b_simple = [p for piece in logged for p in piece.get("gns/b_simple", [])]
    assert b_simple == list(nearest.b_simple), "a noise scale is not a loss: served as recorded"

    with pytest.raises(replay.NotRecorded, match="outside the recorded grid"):
        replay.find(key(2048, 0.004), sweep)
    with pytest.raises(replay.NotRecorded, match="one of which failed"):
        replay.find(key(300, 0.014), sweep)


def test_tables_of_several_model_sizes_replay_the_one_named(tmp_path):
    """Tables whose runs hold model.params of two sizes: a sweep without replay.params is refused
    naming them; with one, its runs are served; a size the tables lack is refused."""
    trials, curves = WORLD.tables(WORLD.grid(batches=BATCHES, lrs=LRS[:3], seeds=1))
    for size, rows in ((1000, trials), (8000, [dict(r) for r in trials])):
        for r in rows:
            r["model.params"] = size
    bigger = [{**r, "trial": "big " + r["trial"]} for r in trials if r["model.params"] == 1000]
    for r in bigger:
        r["model.params"] = 8000
    folder = write_tables(trials + bigger, curves + [("big " + c[0], *c[1:]) for c in curves], tmp_path / "t")

    def sweep(params=None):
        return Sweep(path=tmp_path / "sweep.yaml", replay=ReplayConfig(str(folder), params))

    with pytest.raises(ConfigError, match="several model sizes .1,000, 8,000.; name one"):
        replay.check(sweep())
    assert replay.find(key(512, LRS[1]), sweep(8000)).run.name.startswith("big ")
    assert not replay.find(key(512, LRS[1]), sweep(1000)).run.name.startswith("big ")
    with pytest.raises(ConfigError, match="replay.params: no run of model.params 4,000"):
        replay.check(sweep(4000))
    # Without replay.params, each trial serves its own size (a ladder's rungs), 8,000 over 1,000.
    assert replay.find({**key(512, LRS[1]), replay.PARAMS: 8000}, sweep()).run.name.startswith("big ")
    assert not replay.find({**key(512, LRS[1]), replay.PARAMS: 1000}, sweep()).run.name.startswith("big ")
    assert replay.find({**key(512, LRS[1]), replay.PARAMS: 1000}, sweep(8000)).run.name.startswith("big ")
    with pytest.raises(ConfigError, match="model.params: no run of model.params 16 "):
        replay.check(sweep(), [config.load(ROOT / "conf" / "train" / "linreg.yaml")])  # its model.dim, 16


def published_grid(path, rungs, batches, lrs):
    """A grid in the published format (../shared/data/README.md) over `rungs` (Na, D) x batches x
    lrs, its smoothed loss 2.4 + the point's index / 100 per rung, and one run of another size."""
    header = ["seq_len", "Na", "D", "bs", "ti", "lr", "loss", "smooth loss"]
    points = [(b, lr) for b in batches for lr in lrs]
    rows = [
        [2048, n, d, b // 2048, d // b, lr, 2.5 + i / 100, 2.4 + i / 100]
        for n, d in rungs
        for i, (b, lr) in enumerate(points)
    ]
    n, d = rungs[0]
    rows.append([2048, n // 3, d, batches[0] // 2048, d // batches[0], lrs[0], 2.9, 2.8])
    path.write_text("\n".join(",".join(map(str, r)) for r in [header, *rows]) + "\n")
    return path


@pytest.mark.parametrize("shipped", ["replay_moe.yaml", "replay_moe_ladder.yaml"])
def test_the_shipped_moe_replays_serve_their_first_round_from_converted_tables(shipped, tmp_path, monkeypatch, capsys):
    """conf/sweep/replay_moe.yaml (one rung) and replay_moe_ladder.yaml (15 rungs of 4 model
    sizes) over tables that benchmarks/steplaw_tables.py converts from a grid in the published
    format (rows of our own, as CI has no ../shared): every trial of the first round is served the
    recorded final loss of its own rung, batch and lr, as one report at the budget; the dry run
    says that nothing trains."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import steplaw_tables

    from orchestrator.studies import kinds

    body = yaml.safe_load((ROOT / "conf" / "sweep" / shipped).read_text())
    if "ladder" in body:
        rungs = [(r["overrides"]["model.dim"], r["total_tokens"]) for r in body["ladder"]["rungs"]]
    else:
        rungs = [(body["replay"]["params"], body["base"]["overrides"]["train.total_tokens"])]
    batches, lrs = body["space"]["batch.tokens_per_update"]["grid"], body["space"]["optim.lr"]["grid"]
    data = published_grid(tmp_path / "grid.csv", rungs, batches, lrs)
    assert steplaw_tables.main([str(tmp_path / "tables"), "--data", str(data)]) == 0
    body["replay"]["tables"] = str(tmp_path / "tables")
    body["base"]["config"] = str(ROOT / "conf" / "train" / "linreg.yaml")
    (tmp_path / shipped).write_text(yaml.safe_dump(body))

    code, out, err = run_main(capsys, "sweep", tmp_path / shipped, "--dry-run")
    assert code == 0, err
    assert f"replay: every trial is served from {tmp_path / 'tables'} and trains nothing" in out
    prepared = kinds.prepare(str(tmp_path / shipped), [])
    first_round = [t.cfg for t in prepared.all_trials()]
    assert len(first_round) == len(rungs) * len(batches) * len(lrs)
    replay.check(prepared.sweep, first_round)
    points = [(b, lr) for b in batches for lr in lrs]
    for cfg in first_round:
        values = replay.values_of(cfg)
        logged, reported = [], []
        served = replay.find(values, prepared.sweep)
        assert served.run.params["model.params"] == str(values[replay.PARAMS] if "ladder" in body else rungs[0][0])
        assert replay.serve(values, prepared.sweep, logged.append, reported.append).startswith("recorded run")
        i = points.index((cfg.batch.tokens_per_update, cfg.optim.lr))
        assert [(r["tokens"], r["eval_loss"]) for r in reported] == [
            (cfg.train.total_tokens, pytest.approx(2.4 + i / 100))
        ]


@pytest.mark.slow
def test_a_replay_sweep_reports_what_the_tables_say(ray_session, tmp_path, monkeypatch, capsys):
    """A grid sweep over the tables' own grid, every trial replayed (no training: linear
    regression's config only names the keys), whose closing report prints the answer `report DIR`
    prints of the tables."""
    monkeypatch.chdir(tmp_path)
    folder = recorded_tables(tmp_path / "tables")
    overrides = {k: v for k, v in WORLD.params(WORLD.grid(batches=BATCHES[:1], lrs=LRS[:1])[0]).items()}
    overrides.pop("batch.tokens_per_update"), overrides.pop("optim.lr")
    sweep = {
        "name": "replayed",
        "base": {"config": str(ROOT / "conf" / "train" / "linreg.yaml"), "overrides": overrides},
        "space": {"batch.tokens_per_update": {"grid": list(BATCHES)}, "optim.lr": {"grid": list(LRS)}},
        "search": {"max_concurrent": 2},  # as many as CI's cores: each new trial process imports torch and MLflow
        "replay": {"tables": "tables"},
    }
    (tmp_path / "replayed.yaml").write_text(yaml.safe_dump(sweep))
    uri = sqlite_store(tmp_path)
    code, out, err = run_main(capsys, "sweep", tmp_path / "replayed.yaml", f"tracking.uri={uri}")
    assert code == 0, out[-3000:] + err[-3000:]
    recorded = tables.read(folder)
    finished = [t for t in recorded if t.status == "FINISHED"]
    assert 0 < len(finished) < len(recorded), "the premise: a recorded run diverged"
    assert f"{len(finished)} of {len(recorded)} trials reached the budget" in out
    code, direct, err = run_main(capsys, "report", folder, "--out", tmp_path / "direct")
    assert code == 0, err

    def answer(printed):
        """From the report's line on, word by word, with the runs' names (the sweep names its
        trials, the tables their runs) as one word; without what only one of the two says: the
        sweep's link to MLflow and its recommended.yaml (from its base config), the folder's
        default settings."""
        lines = printed.splitlines()
        start = next(i for i, line in enumerate(lines) if line.startswith("report: ")) + 1
        kept = [line for line in lines[start:] if not line.startswith(("every trial's", "  http", "Settings by"))]
        kept = [re.sub(r" \(recommended\.yaml [^)]*\)", "", line) for line in kept]
        return [re.sub(r"B=\S+ lr=\S+ (wu=\S+%|seed=\d+)", "<run>", line).split() for line in kept]

    assert answer(out) == answer(direct) and len(answer(direct)) > 5
    parent = Store(uri, "orchestrator").find_sweep_run("replayed")
    assert Store(uri).get_run(parent).tags[run_tags.SWEEP_CURVES_TAG], "the sweep's curves as one table"
    code, again, err = run_main(capsys, "report", "replayed", f"tracking.uri={uri}", "--out", tmp_path / "again")
    assert code == 0, err
    assert answer(again) == answer(out), "the report read from the sweep's one table says the same"
    runs = Store(uri).child_runs(parent)
    assert sorted(r.status for r in runs) == sorted(t.status for t in recorded)
    (failed,) = [r for r in runs if r.status == "FAILED"]
    assert "ended FAILED" in failed.tags[run_tags.FAILURE_TAG]
