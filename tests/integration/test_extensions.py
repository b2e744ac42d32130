"""What a user adds from files of their own, with no file under orchestrator/ knowing of it
(issue 53): a kind of study (`ToyKind`: a `toy:` section of the sweep file, its own keys and
rule, the trials it plans, a tag of its own), registered with studies/kinds.register; and a
tracker beside MLflow (`JsonlSink`, named by its import path in `tracking.sinks`), which receives
every param, metric, tag and status of a sweep and then holds what MLflow holds for its runs.

One tiny real sweep of the toy kind, mirrored into the sink, proves both. The sink is built where
the runs are written: the sweep's driver (its parent run, and the trials it closes), each trial's
process (its child run) and the worker (its metrics, through MetricLogger). Those are Ray's
processes, which import this module by its path: `ray.init` puts the driver's working directory,
this repository's root where pytest runs, on its workers' sys.path (JobConfig._py_driver_sys_path),
as for tests/fixtures/user_workload.py's workload; the study kind crosses in the trial's set-up."""

import json
import os
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List

import pytest
import yaml

from orchestrator.core.errors import ConfigError
from orchestrator.core.sweep_schema import Section, Sweep
from orchestrator.core.validation import Field, count
from orchestrator.studies import kinds
from orchestrator.studies.search_space import Values
from orchestrator.studies.study import StudyKind
from orchestrator.tracking import run_tags
from orchestrator.tracking.store import Store
from orchestrator.tracking.tracker import RunSink
from tests.conftest import ROOT, run_main, sqlite_store

SINK = "tests.integration.test_extensions:JsonlSink"
PASSWORD = "PW-hunter2"


@dataclass(frozen=True)
class ToyConfig:
    lrs: List[float] = field(default_factory=list)
    """The learning rates, one trial each."""
    batch: int = 2048
    """The tokens per update every trial trains at."""


def _lrs_given(sweep: Sweep) -> None:
    if not sweep.sections["toy"].lrs:
        raise ConfigError("toy.lrs", "missing: the learning rates, e.g. [1e-3, 3e-3]")


class ToyKind(StudyKind):
    """One trial per lr at one batch size, every trial tagged with its lr's rank."""

    name = "toy study"
    section = Section("toy", ToyConfig, {"toy.lrs": Field("list"), "toy.batch": count()})
    rules = (_lrs_given,)

    def values(self, sweep: Sweep) -> List[Values]:
        toy = sweep.sections["toy"]
        return [{"batch.tokens_per_update": toy.batch, "optim.lr": lr} for lr in toy.lrs]

    def run_tags(self, sweep: Sweep, cfg) -> Dict[str, str]:
        return {"toy.rank": str(sorted(sweep.sections["toy"].lrs).index(cfg.optim.lr))}


@pytest.fixture
def toy_kind():
    kind = kinds.register(ToyKind())
    yield kind
    kinds.KINDS.remove(kind)


def toy_sweep(folder, name="toy", description=None, **toy) -> str:
    body = yaml.safe_load((ROOT / "conf" / "sweep" / "smoke.yaml").read_text())
    body["base"]["config"] = str(ROOT / "conf" / "train" / "tiny.yaml")
    body["base"]["overrides"].update({"train.total_tokens": 24576, "train.checkpoint_every_tokens": 8192})
    body["base"]["overrides"].update({"train.eval_every_tokens": 8192})
    body.update(name=name, toy=toy, **({"description": description} if description else {}))
    body.pop("space")
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(body))
    return path


def test_a_registered_kind_reads_its_section_checks_its_rule_and_plans_its_trials(toy_kind, tmp_path, capsys):
    path = toy_sweep(tmp_path, lrs=[1e-3, 3e-3])
    sweep = kinds.load(path)
    assert kinds.kind_of(sweep) is toy_kind and sweep.sections["toy"] == ToyConfig([1e-3, 3e-3], 2048)
    assert [(t.cfg.batch.tokens_per_update, t.cfg.optim.lr) for t in kinds.expand(sweep)] == [
        (2048, 1e-3),
        (2048, 3e-3),
    ]
    code, out, err = run_main(capsys, "sweep", path, "--dry-run")
    assert code == 0, err
    assert "sweep 'toy': 2 trials (grid search); nothing started" in out
    assert out.count("B=2Ki lr=") == 2 and "lr=1e-3" in out and "lr=3e-3" in out
    # its own rule and its own keys' rows, each one line and exit 2
    for toy, expected in [
        ({"lrs": []}, "toy.lrs: missing"),
        ({"lrs": [1e-3], "batch": 0}, "toy.batch"),
        ({"lrs": [1e-3], "epochs": 2}, "toy.epochs: unknown key"),
    ]:
        code, out, err = run_main(capsys, "sweep", toy_sweep(tmp_path, **toy), "--dry-run")
        assert code == 2 and expected in err and len(err.strip().splitlines()) == 1, err
    # without the kind registered, the section is not a key of the sweep file
    kinds.KINDS.remove(toy_kind)
    try:
        code, _, err = run_main(capsys, "sweep", path, "--dry-run")
    finally:
        kinds.KINDS.insert(0, toy_kind)
    assert code == 2 and "toy: unknown key" in err


class JsonlSink:
    """Every write as one JSON line, in a file of its own per process (concurrent trials never
    share one), in the folder `sink` beside the MLflow SQLite store it mirrors."""

    def __init__(self, context):
        folder = Path(context.uri.removeprefix("sqlite:///")).parent / "sink"
        folder.mkdir(exist_ok=True)
        self.path = folder / f"{os.getpid()}-{id(self)}.jsonl"
        self.lock = threading.Lock()  # a worker's metrics come from MetricLogger's thread

    def _write(self, event: str, run_id: str, **fields) -> None:
        line = json.dumps({"time": time.time(), "event": event, "run_id": run_id, **fields})
        with self.lock, self.path.open("a") as f:
            f.write(line + "\n")

    def start_run(self, run_id, name, tags):
        self._write("start", run_id, name=name, tags=dict(tags))

    def log_params(self, run_id, params):
        self._write("params", run_id, params=dict(params))

    def log_metrics(self, run_id, metrics, step):
        self._write("metrics", run_id, metrics=dict(metrics), step=step)

    def set_tags(self, run_id, tags):
        self._write("tags", run_id, tags=dict(tags))

    def delete_tags(self, run_id, keys):
        self._write("delete_tags", run_id, keys=list(keys))

    def log_text(self, run_id, text, artifact_file):
        self._write("text", run_id, text=text, file=artifact_file)

    def set_status(self, run_id, status):
        self._write("status", run_id, status=status)


def mirrored(folder: Path) -> dict:
    """{run id: what the sink holds of it}, its lines replayed in the order they were written."""
    lines = [json.loads(line) for path in folder.glob("*.jsonl") for line in path.read_text().splitlines()]
    runs = defaultdict(lambda: {"params": {}, "tags": {}, "metrics": defaultdict(list), "texts": {}})
    for e in sorted(lines, key=lambda e: e["time"]):
        run = runs[e["run_id"]]
        if e["event"] == "start":
            run.update(name=e["name"], status="RUNNING")
            run["tags"].update(e["tags"])
        elif e["event"] == "params":
            assert not set(e["params"]) & set(run["params"]), "each param once"
            run["params"].update(e["params"])
        elif e["event"] == "metrics":
            for key, value in e["metrics"].items():
                run["metrics"][key].append((e["step"], value))
        elif e["event"] == "tags":
            run["tags"].update(e["tags"])
        elif e["event"] == "delete_tags":
            for key in e["keys"]:
                del run["tags"][key]
        elif e["event"] == "text":
            run["texts"][e["file"]] = e["text"]
        else:
            run["status"] = e["status"]
    return dict(runs)


def test_a_second_kind_with_the_same_section_is_refused_and_changes_nothing(toy_kind):
    class Other(StudyKind):
        section = Section("toy", ToyConfig, {})

    before = list(kinds.KINDS)
    with pytest.raises(ValueError, match="section 'toy' is registered already"):
        kinds.register(Other())
    assert kinds.KINDS == before and kinds.register(ToyKind()) is not toy_kind  # the same class: replaced
    assert [type(k) for k in kinds.KINDS].count(ToyKind) == 1
    kinds.KINDS[:] = before


@pytest.mark.slow
def test_a_sweep_of_a_registered_kind_mirrored_into_a_sink_of_your_own(
    toy_kind, ray_session, tmp_path, monkeypatch, capsys
):
    """The toy kind's trials train on Ray and are logged as any sweep's (one child run per trial,
    with the kind's own tag); the sink then holds what MLflow holds for the parent and each trial."""
    assert issubclass(JsonlSink, RunSink)  # the protocol's methods, nothing inherited
    uri = sqlite_store(tmp_path)
    path = toy_sweep(tmp_path, lrs=[1e-3, 3e-3], description=f"a copy at https://u:{PASSWORD}@example.com/runs")
    monkeypatch.chdir(tmp_path)
    code, out, err = run_main(capsys, "sweep", path, f"tracking.uri={uri}", f"tracking.sinks=[{SINK}]")
    assert code == 0, out[-3000:] + err[-3000:]
    assert "sweep 'toy': 2 trials" in out

    store = Store(uri, "orchestrator")
    parent = store.find_sweep_run("toy")
    assert store.get_run(parent).tags[run_tags.SEARCH_TAG] == "grid"
    trials = store.child_runs(parent)
    assert sorted((r.params["optim.lr"], r.tags["toy.rank"], r.status) for r in trials) == [
        ("0.001", "0", "FINISHED"),
        ("0.003", "1", "FINISHED"),
    ]
    runs = [store.get_run(parent), *trials]
    sink = mirrored(tmp_path / "sink")
    assert set(sink) == {r.run_id for r in runs}, "every run, and no other"
    for run in runs:
        got = sink[run.run_id]
        assert (got["name"], got["status"]) == (run.name, run.status), run.name
        assert got["params"] == run.params, run.name
        # every tag the project set (MLflow's own, mlflow.runName and the like, are MLflow's)
        assert got["tags"] == {k: v for k, v in run.tags.items() if k in got["tags"] or not k.startswith("mlflow.")}
        assert set(got["metrics"]) == set(run.metrics), run.name
        for key, points in got["metrics"].items():
            assert sorted(points) == store.metric_history(run.run_id, key), (run.name, key)
        for file, text in got["texts"].items():
            assert text == store.read_text_artifact(run.run_id, file), (run.name, file)
    assert "eval/loss" in sink[trials[0].run_id]["metrics"]
    assert {"config.yaml", "plan.txt", "deepspeed.json"} <= set(sink[trials[0].run_id]["texts"])
    assert "u:***@example.com" in sink[parent]["texts"]["toy.yaml"]  # the sweep file, as MLflow has it
    assert not [p for p in (tmp_path / "sink").iterdir() if PASSWORD in p.read_text()], "no secret"
