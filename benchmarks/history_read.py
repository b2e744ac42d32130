"""How long `orchestrator report` takes to read a sweep's curves out of MLflow at 1,000 runs (issue 39,
"Histories in bulk"): from a SQLite store and from a local tracking server over the same file, by
one history call per run and curve and from each run's curves artifact, and, as a baseline, the
same points from one Parquet file.

    python benchmarks/history_read.py [--runs 100,300] [--points 1000] [--metrics 2] [--server-workers 2]
                                      [--no-server] [--no-analyze] [--no-history-calls] [--keep] [--json PATH]

The defaults take about 6 minutes on 2 cores; `--runs 1000` alone about 20 (8 of them logging),
`--runs 1000 --no-history-calls` a few. For each size in --runs, in a fresh temporary folder: a
SQLite store (`sqlite:///DIR/mlflow.db`) gets a sweep parent run and that many finished child
runs, each with --metrics curves (train/loss, eval/loss, then the other curves the report reads)
of --points points, step = tokens as the trainer logs them, sent with Store.log_history
(MlflowClient.log_batch, at most 1,000 metrics a call). Then the report's own reader is timed,
wall clock and this process's CPU: report_inputs.sweep_runs (the search for the sweep's runs) and
report_inputs.read_curves (Store.histories), as `report` calls them:

- sqlite, server: runs without a curves artifact (ended before Store.write_curves existed, or
  still running): one get_metric_history call per run and curve, one at a time from SQLite, 8 runs
  at a time from `mlflow server --backend-store-uri` that same file on 127.0.0.1 at a free port
  (`--workers 2`; its processes' CPU counted too);
- sqlite, ANALYZE: the SQLite read again after SQLite's ANALYZE: without the statistics it
  writes, SQLite answers MLflow's history query (WHERE run_uuid = ? AND key = ?) from the primary
  key's index (key, timestamp, ...), every point of that key in the store, so a call costs more
  as the store grows; with them, from the index on (run_uuid, key, step) (the plans are printed);
- sqlite, artifact: the same runs once Store.write_curves (what run_life.close_run does as a run
  ends) gave each its curves.parquet, artifacts beside the store: one download a run;
- server, artifact: a second sweep of as many runs made through the server (each curve's last
  point logged, its artifacts at mlflow-artifacts:/, served by the server as deploy/mlflow's),
  curves artifacts written through the server, read through the server;
- parquet: every run's points in one Parquet file (run, metric, step, value), written once.

Every read must return every point logged, into the same {run: {metric: [(step, value)]}}. Not
timed: importing MLflow and opening the store, once per command.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks import _common as common  # noqa: E402
from orchestrator.reporting import report_inputs  # noqa: E402
from orchestrator.tracking.run_tags import PARENT_TAG, ROLE_TAG, SWEEP_ROLE  # noqa: E402
from orchestrator.tracking.store import MAX_METRICS, Store  # noqa: E402

KEYS = tuple(report_inputs.METRICS)  # train/loss, eval/loss, then the other curves the report reads
SERVER_ENV = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}  # as deploy/mlflow/local-server.sh

SOURCES = ("sqlite", "sqlite, ANALYZE", "sqlite, artifact", "server", "server, artifact", "parquet")
Curves = Dict[str, Dict[str, List[Tuple[int, float]]]]


def curves_of(i: int, keys: Tuple[str, ...], points: int, seed: int = 0) -> Dict[str, List[Tuple[int, float]]]:
    """Run i's curves: `points` points per key, step = tokens (update k of a run at T tokens per
    update is at step (k + 1) T, six batch sizes as a sweep's grid), a falling loss with noise."""
    tokens_per_update = 2 ** (9 + i % 6) * 64
    steps = tokens_per_update * np.arange(1, points + 1, dtype=np.int64)
    rng = np.random.default_rng([seed, i])
    out = {}
    for j, key in enumerate(keys):
        values = 2.0 + j + 6.0 / np.sqrt(1.0 + steps / 2e6) + 0.01 * rng.standard_normal(points)
        out[key] = list(zip(steps.tolist(), values.tolist()))
    return out


def make_sweep(uri: str, sweep: str, runs: int, keys: Tuple[str, ...], points: int, full: bool) -> Dict[str, Any]:
    """A sweep parent run and `runs` finished child runs (curves_of) in experiment `sweep` of the
    store at `uri`, through the project's door (Store: experiment as ensure_experiment makes it,
    points by log_history, MLflow's largest batches): every point (`full`), else each curve's
    last, what MLflow's latest metrics need to say which curves a run has. Its ids and seconds."""
    store = Store(uri, sweep)
    started = time.perf_counter()
    parent = store.create_run(sweep, tags={ROLE_TAG: SWEEP_ROLE})
    ids = []
    for i in range(runs):
        run_id = store.create_run(f"run-{i}", tags={PARENT_TAG: parent})
        curves = curves_of(i, keys, points)
        store.log_history(run_id, curves if full else {k: c[-1:] for k, c in curves.items()})
        store.finish_run(run_id)
        ids.append(run_id)
    return {"parent": parent, "ids": ids, "log_s": time.perf_counter() - started}


def write_parquet(path: Path, ids: List[str], keys: Tuple[str, ...], points: int) -> None:
    """Every run's points in one file: run, metric (dictionary-encoded), step, value."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    columns: Dict[str, list] = {"run": [], "metric": [], "step": [], "value": []}
    for i, run_id in enumerate(ids):
        for key, curve in curves_of(i, keys, points).items():
            columns["run"] += [run_id] * len(curve)
            columns["metric"] += [key] * len(curve)
            columns["step"] += [s for s, _ in curve]
            columns["value"] += [v for _, v in curve]
    table = pa.table(
        {
            "run": pa.array(columns["run"]).dictionary_encode(),
            "metric": pa.array(columns["metric"]).dictionary_encode(),
            "step": pa.array(columns["step"], pa.int64()),
            "value": pa.array(columns["value"], pa.float64()),
        }
    )
    pq.write_table(table, path)


def check(curves: Curves, ids: List[str], keys: Tuple[str, ...], points: int, what: str) -> None:
    """The curves read are the runs' curves_of, every point."""
    assert len(curves) == len(ids), f"{what}: {len(curves)} runs read of {len(ids)}"
    for i, run_id in enumerate(ids):
        assert curves[run_id] == curves_of(i, keys, points), f"{what}: run {i}'s curves differ"


def write_artifacts(uri: str, ids: List[str], keys: Tuple[str, ...], points: int) -> float:
    """Store.write_curves of every run (what run_life.close_run does as a run ends); its seconds."""
    store, seconds = Store(uri), 0.0
    for i, run_id in enumerate(ids):
        curves = curves_of(i, keys, points)  # made outside the time
        started = time.perf_counter()
        store.write_curves(run_id, curves)
        seconds += time.perf_counter() - started
    return seconds


def read_report_curves(uri: str, parent: str) -> Tuple[Curves, Dict[str, float]]:
    """What `orchestrator report` does to a sweep in MLflow before its analysis (report_inputs.read_mlflow):
    find the sweep's runs, then read their curves; wall and process CPU seconds of each."""
    wall, cpu = time.perf_counter(), time.process_time()
    runs = report_inputs.sweep_runs(uri, parent)
    found_wall, found_cpu = time.perf_counter(), time.process_time()
    curves = report_inputs.read_curves(uri, runs)
    done_wall, done_cpu = time.perf_counter(), time.process_time()
    figures = {
        "find_wall_s": found_wall - wall,
        "find_cpu_s": found_cpu - cpu,
        "read_wall_s": done_wall - found_wall,
        "read_cpu_s": done_cpu - found_cpu,
    }
    return {r: {k: c for k, c in cs.items() if c} for r, cs in curves.items()}, figures


def read_parquet(path: Path) -> Tuple[Curves, Dict[str, float]]:
    """The same points as one columnar file, read into the reader's {run: {metric: [(step, value)]}}."""
    import pyarrow.parquet as pq

    wall, cpu = time.perf_counter(), time.process_time()
    table = pq.read_table(path)
    table_wall, table_cpu = time.perf_counter(), time.process_time()
    run, metric = (table.column(c).combine_chunks() for c in ("run", "metric"))
    run_ix, metric_ix = run.indices.to_numpy(), metric.indices.to_numpy()
    run_names, metric_names = run.dictionary.to_pylist(), metric.dictionary.to_pylist()
    order = np.lexsort((table.column("step").to_numpy(), metric_ix, run_ix))
    run_ix, metric_ix = run_ix[order], metric_ix[order]
    steps, values = table.column("step").to_numpy()[order].tolist(), table.column("value").to_numpy()[order].tolist()
    bounds = np.flatnonzero((np.diff(run_ix) != 0) | (np.diff(metric_ix) != 0)) + 1
    curves: Curves = {}
    for a, b in zip([0, *bounds.tolist()], [*bounds.tolist(), len(steps)]):
        curves.setdefault(run_names[run_ix[a]], {})[metric_names[metric_ix[a]]] = list(zip(steps[a:b], values[a:b]))
    done_wall, done_cpu = time.perf_counter(), time.process_time()
    figures = {
        "find_wall_s": 0.0,
        "find_cpu_s": 0.0,
        "read_wall_s": done_wall - wall,
        "read_cpu_s": done_cpu - cpu,
        "table_wall_s": table_wall - wall,
        "table_cpu_s": table_cpu - cpu,
    }
    return curves, figures


HISTORY_QUERY = "SELECT * FROM metrics WHERE run_uuid = ? AND key = ? ORDER BY timestamp, step, value"
"""The query of MLflow's SqlAlchemyStore.get_metric_history (MLflow 3.17), for its plan."""


def query_plan(db: Path, key: str) -> str:
    """How SQLite answers HISTORY_QUERY for one run's `key`."""
    with sqlite3.connect(db) as con:
        (run_id,) = con.execute("SELECT run_uuid FROM metrics LIMIT 1").fetchone()
        rows = con.execute("EXPLAIN QUERY PLAN " + HISTORY_QUERY, (run_id, key)).fetchall()
    return "; ".join(r[-1] for r in rows)


def analyze(db: Path) -> float:
    """SQLite's ANALYZE on the store (statistics for the query planner, in the file); its seconds."""
    started = time.perf_counter()
    con = sqlite3.connect(db)
    try:
        con.execute("ANALYZE")
        con.commit()
    finally:
        con.close()
    return time.perf_counter() - started


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2.0) as reply:
            return reply.status == 200
    except OSError:
        return False


def server_cpu(pid: int) -> float:
    """User + system CPU seconds of the server and its worker processes so far."""
    import psutil

    try:
        leader = psutil.Process(pid)
        procs = [leader, *leader.children(recursive=True)]
    except psutil.Error:
        return 0.0
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


def with_server(folder: Path, store_uri: str, workers: int, read: Callable[[str, int], Any]) -> Any:
    """read(server URI, server pid) with `mlflow server` over `store_uri` on 127.0.0.1, stopped after."""
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "mlflow",
        "server",
        "--backend-store-uri",
        store_uri,
        "--artifacts-destination",
        str(folder / "artifacts"),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        str(workers),
    ]
    with (folder / "server.log").open("ab") as log:
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env={**os.environ, **SERVER_ENV}
        )
    try:
        started, deadline = time.perf_counter(), time.monotonic() + 180
        while not answers(f"http://127.0.0.1:{port}/health"):
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = (folder / "server.log").read_text(errors="replace")[-3000:]
                raise SystemExit(f"mlflow server did not come up:\n{tail}")
            time.sleep(0.3)
        print(f"  mlflow server (--workers {workers}) up on port {port} in {time.perf_counter() - started:.1f} s")
        return read(f"http://127.0.0.1:{port}", proc.pid)
    finally:
        _stop(proc)


def _stop(proc: subprocess.Popen, grace: float = 15.0) -> None:
    """SIGTERM to the server's own process group, SIGKILL to whatever is left after `grace` s."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=grace)
            if sig == signal.SIGTERM:
                try:  # the leader is gone; its workers may not be
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            break
        except subprocess.TimeoutExpired:
            continue
    proc.wait()


def measure(
    folder: Path, runs: int, points: int, keys: Tuple[str, ...], workers: int, opts: argparse.Namespace
) -> Dict[str, Any]:
    """One size: make the store, then the reads, each checked against the curves logged."""
    uri = f"sqlite:///{folder}/mlflow.db"
    main = make_sweep(uri, "history-read", runs, keys, points, opts.history)
    write_parquet(folder / "curves.parquet", main["ids"], keys, points)
    total = runs * len(keys) * points
    logged = f"{runs:,} runs x {len(keys)} curves x {points:,} points ({total:,} points)"
    if opts.history:
        calls = runs * -(-len(keys) * points // MAX_METRICS)
        logged += (
            f": logged in {main['log_s']:.1f} s ({calls:,} log_batch calls, {total / main['log_s']:,.0f} points/s)"
        )
    print(logged)
    reads: Dict[str, Dict[str, float]] = {}
    writes: Dict[str, float] = {}

    def read(uri: str, sweep: Dict[str, Any], name: str, pid: Optional[int] = None) -> None:
        before = server_cpu(pid) if pid else 0.0
        curves, figures = read_report_curves(uri, sweep["parent"])
        if pid:
            figures["server_cpu_s"] = server_cpu(pid) - before
        reads[name] = figures
        print(f"  {name}: {figures['read_wall_s']:.1f} s")
        check(curves, sweep["ids"], keys, points, name)

    if opts.history:
        read(uri, main, "sqlite")
    if opts.server:

        def on_server(server_uri: str, pid: int) -> None:
            if opts.history:
                read(server_uri, main, "server", pid)
            served = make_sweep(server_uri, "history-read-served", runs, keys, points, full=False)
            writes["server"] = write_artifacts(server_uri, served["ids"], keys, points)
            print(f"  curves artifacts written through the server: {writes['server']:.1f} s")
            read(server_uri, served, "server, artifact", pid)

        with_server(folder, uri, workers, on_server)
    plans, analyze_s = {}, None
    if opts.history:
        plans["before"] = query_plan(folder / "mlflow.db", keys[0])
        if opts.analyze:
            analyze_s = analyze(folder / "mlflow.db")
            plans["after_analyze"] = query_plan(folder / "mlflow.db", keys[0])
            print(f"  ANALYZE: {analyze_s:.1f} s")
            read(uri, main, "sqlite, ANALYZE")
        for when, plan in plans.items():
            print(f"  query plan {when.replace('_', ' ')}: {plan}")
    writes["sqlite"] = write_artifacts(uri, main["ids"], keys, points)
    print(f"  curves artifacts written: {writes['sqlite']:.1f} s")
    read(uri, main, "sqlite, artifact")
    parquet_curves, reads["parquet"] = read_parquet(folder / "curves.parquet")
    check(parquet_curves, main["ids"], keys, points, "parquet")
    for figures in reads.values():
        figures["points_per_s"] = total / figures["read_wall_s"]
        figures["read_s_per_1000_runs"] = figures["read_wall_s"] * 1000 / runs
        figures["total_s_per_1000_runs"] = (figures["read_wall_s"] + figures["find_wall_s"]) * 1000 / runs
    return {
        "runs": runs,
        "metrics": list(keys),
        "points_per_curve": points,
        "points": total,
        "history_calls": runs * len(keys),
        "log_s": main["log_s"] if opts.history else None,
        "db_mb": (folder / "mlflow.db").stat().st_size / 2**20,
        "parquet_mb": (folder / "curves.parquet").stat().st_size / 2**20,
        "analyze_s": analyze_s,
        "query_plans": plans,
        "write_curves_s": writes,
        "reads": reads,
    }


def main(argv: List[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", default="100,300", help="child runs of the sweep; a comma list measures each size")
    p.add_argument("--points", type=int, default=1000, help="points per curve")
    p.add_argument("--metrics", type=int, default=2, help=f"curves per run, the first of {', '.join(KEYS)}")
    p.add_argument("--server-workers", type=int, default=2, help="`mlflow server --workers` (default 2)")
    p.add_argument("--no-server", dest="server", action="store_false", help="leave out the tracking server")
    p.add_argument("--no-analyze", dest="analyze", action="store_false", help="leave out the read after ANALYZE")
    p.add_argument(
        "--no-history-calls",
        dest="history",
        action="store_false",
        help="log each curve's last point only and time the curves artifacts alone (fast at 1,000 runs)",
    )
    p.add_argument("--keep", action="store_true", help="keep the temporary folder")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    if not 1 <= args.metrics <= len(KEYS):
        p.error(f"--metrics: 1 to {len(KEYS)}")

    load_before = os.getloadavg()[0]
    keys = KEYS[: args.metrics]
    # MLflow draws a progress bar per artifact download (`report` too), prints two links per run
    # ended through a server, and logs its database set-up: none of it is the figure
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")
    tmp = Path(tempfile.mkdtemp(prefix="history-read-"))
    cases = []
    try:
        for runs in sorted(int(n) for n in args.runs.split(",")):
            folder = tmp / f"runs-{runs}"
            folder.mkdir()
            cases.append(measure(folder, runs, args.points, keys, args.server_workers, args))
            if not args.keep:
                shutil.rmtree(folder, ignore_errors=True)
    finally:
        if args.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    rows = [
        (
            "runs",
            "source",
            "history calls",
            "find runs",
            "read curves",
            "client CPU",
            "server CPU",
            "points/s",
            "s / 1,000 runs",
        )
    ]
    for case in cases:
        for source, f in sorted(case["reads"].items(), key=lambda item: SOURCES.index(item[0])):
            rows.append(
                (
                    f"{case['runs']:,}",
                    source,
                    f"{case['history_calls']:,}" if "artifact" not in source and source != "parquet" else "-",
                    f"{f['find_wall_s']:.2f} s" if source != "parquet" else "-",
                    f"{f['read_wall_s']:.2f} s",
                    f"{f['read_cpu_s'] + f['find_cpu_s']:.2f} s",
                    f"{f['server_cpu_s']:.2f} s" if "server_cpu_s" in f else "-",
                    f"{f['points_per_s']:,.0f}",
                    f"{f['total_s_per_1000_runs']:.1f}",
                )
            )
    common.print_table(rows)
    print(
        f"\n{args.metrics} curves x {args.points:,} points a run; 'read curves' is report_inputs.read_curves "
        "(Store.histories), 'find runs' report_inputs.sweep_runs, 's / 1,000 runs' both, scaled linearly "
        "from the size measured (which understates a read whose calls cost more as the store grows); "
        f"load average {load_before:.1f} -> {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
    )
    if len(cases) > 1:
        a, b = cases[0], cases[-1]
        for source in a["reads"]:
            ratio = b["reads"][source]["read_wall_s"] / a["reads"][source]["read_wall_s"]
            print(f"{source}: {b['runs'] / a['runs']:.1f}x the runs took {ratio:.2f}x the time to read")
    return common.finish(
        {
            "benchmark": "history_read",
            "server_workers": args.server_workers if args.server else None,
            "cases": cases,
            "machine": common.machine(load_before),
        },
        args.json,
    )


if __name__ == "__main__":
    raise SystemExit(main())
