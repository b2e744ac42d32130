"""The CPU of a local Ray's log monitor at Ray's defaults against the settings a command gives the
Ray it starts (orchestrator/driver/ray_session.py, LOCAL_RAY_SETTINGS), with the log files of
many worker processes behind it, as a long sweep leaves them.

    python benchmarks/log_monitor.py [--processes 60] [--seconds 30]

Each side: a local Ray (2 CPUs, no dashboard, log_to_driver=False, as the tests' and the
commands' Ray), `--processes` short-lived actors (each a worker process with its .out/.err
files), then the log monitor's CPU seconds over `--seconds` with nothing else running. Defaults
first, then the settings, in one command.

    ratio = CPU(settings) / CPU(defaults)
"""

from __future__ import annotations

import argparse
import os
import time

import psutil
import ray

from orchestrator.driver.ray_session import LOCAL_RAY_SETTINGS


def log_monitor_cpu(processes: int, seconds: float) -> tuple:
    ray.init(
        num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1", logging_level="WARNING", log_to_driver=False
    )
    try:

        @ray.remote(num_cpus=0.1)
        class Talker:
            def say(self) -> int:
                print("a line of worker output")
                return os.getpid()

        for start in range(0, processes, 20):
            actors = [Talker.remote() for _ in range(min(20, processes - start))]
            ray.get([a.say.remote() for a in actors])
            for actor in actors:
                ray.kill(actor)
        time.sleep(5)
        node = ray._private.worker._global_node
        (monitor,) = [
            p
            for p in psutil.process_iter(["cmdline"])
            if "log_monitor.py" in " ".join(p.info["cmdline"] or [])
            and node.get_session_dir_path() in " ".join(p.info["cmdline"] or [])
        ]
        before = sum(monitor.cpu_times()[:2])
        time.sleep(seconds)
        files = len(os.listdir(node.get_logs_dir_path()))
        return sum(monitor.cpu_times()[:2]) - before, files
    finally:
        ray.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, default=60)
    parser.add_argument("--seconds", type=float, default=30)
    args = parser.parse_args()
    for name in LOCAL_RAY_SETTINGS:
        os.environ.pop(name, None)
    defaults, files = log_monitor_cpu(args.processes, args.seconds)
    os.environ.update(LOCAL_RAY_SETTINGS)
    settings, _ = log_monitor_cpu(args.processes, args.seconds)
    print(
        f"log files: {files}; log monitor CPU over {args.seconds:.0f} s: defaults {defaults:.2f} s, "
        f"LOCAL_RAY_SETTINGS {settings:.2f} s; ratio {settings / defaults:.2f}"
    )


if __name__ == "__main__":
    main()
