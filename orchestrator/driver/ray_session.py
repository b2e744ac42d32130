"""The Ray this command runs on: join a cluster or start a local Ray bound to 127.0.0.1, read
what its nodes hold (and what its autoscaler may add), and check before anything waits on Ray
that every trial shape can be placed and that every node sees a path storage."""

from __future__ import annotations

import gc
import os
import threading
from typing import Dict, List, Optional

from orchestrator.core import storage
from orchestrator.core.errors import ConfigError
from orchestrator.core.schema import Config
from orchestrator.formulas import feasibility
from orchestrator.tracking.store import env_for_workers

# A Ray this command starts on one machine. Ray Train: no node of it can be preempted, so no
# watcher actor (a process per run); and the controller polls its workers every 0.5 s, not 2 s,
# so that a run's end (and each report's barrier) is noticed sooner: seconds per run. Ray's log
# monitor: this Ray forwards no worker output (log_to_driver=False), so it need not look for new
# log files ten times a second, a search that grows with every trial process a sweep leaves behind.
LOCAL_RAY_SETTINGS = {
    "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0",
    "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.5",
    "RAY_LOG_MONITOR_MANY_FILES_THRESHOLD": "0",
    "LOG_NAME_UPDATE_INTERVAL_S": "30",
}


def on_cluster(cfg: Config) -> bool:
    """Joining an existing Ray cluster (cluster.address, or inside a Ray job: RAY_ADDRESS)."""
    return bool(cfg.cluster.address or os.environ.get("RAY_ADDRESS"))


def ray_init(address: Optional[str] = None) -> bool:
    """Join a cluster, or start a local Ray whose dashboard listens on 127.0.0.1 only. True if
    this call started or joined Ray (False: this process was on Ray already, e.g. a test's).

    Worker output is not forwarded (log_to_driver=False): DeepSpeed's and Ray's worker chatter
    would bury the progress lines, and in Ray Train's local mode the worker is the Tune trial's
    own process anyway. What the user must see comes through MLflow, the source of truth:
    progress, the worker's warnings (rank 0 records them as run tags, `_show_worker_warnings`
    prints them) and a failing worker's traceback, which comes back with the Train error.
    """
    import ray

    if ray.is_initialized():
        return False
    if os.environ.get("RAY_ADDRESS") and not address:
        ray.init(log_to_driver=False)  # inside a Ray job: its runtime_env already carries the env
    elif address:
        ray.init(address=address, runtime_env={"env_vars": env_for_workers()}, log_to_driver=False)
    else:
        for name, value in LOCAL_RAY_SETTINGS.items():  # inherited by the local Ray's workers
            os.environ.setdefault(name, value)
        ray.init(
            dashboard_host="127.0.0.1",
            _node_ip_address="127.0.0.1",
            log_to_driver=False,
            configure_logging=True,
            logging_level="WARNING",
        )
    return True


def shut_down_meanwhile() -> threading.Thread:
    """Leave Ray in a thread: a local Ray's processes take a second or more to end, which the
    caller spends on work that needs Ray no more (the sweep's closing report). Join it before
    the process ends.

    While the driver disconnects, nothing in this process may free a Ray object: an ObjectRef or
    actor handle freed then calls into a core worker half shut down, and Ray aborts the process
    ("The core worker has already been shutdown"). Tune leaves such handles in reference cycles,
    which the cyclic collector frees at whatever allocation triggers it, in the caller's thread;
    so the collector pauses until Ray is left (the caller holds no Ray object itself)."""
    import ray

    collecting = gc.isenabled()
    gc.disable()

    def leave() -> None:
        try:
            ray.shutdown()
        finally:
            if collecting:
                gc.enable()

    thread = threading.Thread(target=leave, name="ray-shutdown")
    thread.start()
    return thread


def cluster_nodes() -> List[Dict[str, float]]:
    """Total resources of the alive nodes, plus the nodes Ray's autoscaler may still add."""
    import ray

    alive = [{k: float(v) for k, v in n["Resources"].items()} for n in ray.nodes() if n["Alive"]]
    groups = []
    try:
        config = ray._private.state.state.get_cluster_config()  # None without an autoscaler
    except Exception:  # an older GCS without the autoscaler's key: judge the nodes there are
        config = None
    for group in getattr(config, "node_group_configs", []):
        groups.append(({k: float(v) for k, v in group.resources.items()}, group.max_count))
    return feasibility.node_groups(alive, groups)


def _node_sees(marker: str) -> Dict[str, bool]:
    """{node address: whether a task pinned to that node finds `marker`} for every alive node."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    @ray.remote(num_cpus=0)
    def exists(path: str) -> bool:
        return os.path.exists(path)

    nodes = [n for n in ray.nodes() if n["Alive"]]
    refs = [
        exists.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote(marker)
        for n in nodes
    ]
    return {f"{n['NodeManagerAddress']} ({n['NodeID'][:8]})": ok for n, ok in zip(nodes, ray.get(refs, timeout=120))}


def check_cluster(cfg: Config, shapes: List[feasibility.Shape]) -> None:
    """Before anything waits on Ray: every shape can be placed, and a path storage is seen by
    every node. ConfigError (exit 2) otherwise."""
    import ray

    nodes = cluster_nodes()
    where = f"the Ray cluster at {cfg.cluster.address}" if on_cluster(cfg) else "this machine's Ray"
    for s in feasibility.distinct(shapes):
        problem = feasibility.problem(s, nodes, where)
        if problem:
            raise ConfigError("cluster", problem)
    if len([n for n in ray.nodes() if n["Alive"]]) > 1:
        storage.check_visible(cfg.train.storage_path, _node_sees)
