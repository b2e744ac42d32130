"""A Ray Train worker's training function (`train_loop._train`, what every worker runs) in the test
process, with a real DeepSpeed engine and MLflow store and a stand-in for the Ray API it reports
to. A one-worker run trains the same in any process, so a test that need not prove Ray Train's
part saves the worker group of a run (a controller, its helper actors and a worker process)."""

from __future__ import annotations

import shutil
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import torch

from orchestrator.core import config
from orchestrator.core.schema import Config
from orchestrator.driver import run_life
from orchestrator.tracking.store import Store
from workloads.train import train_loop
from workloads.train.engine import ensure_process_group
from workloads.train.handoff import WorkerPayload


class FakeRay:
    """What the worker uses of ray.train / ray.tune: report (with a checkpoint folder, copied as
    Ray persists it) and get_checkpoint (the one to resume from, if any)."""

    def __init__(self, folder: Path, resume_from=None):
        self.folder, self.resume_from, self.reports = folder, resume_from, []
        self.Checkpoint = SimpleNamespace(from_directory=lambda path: path)

    def report(self, metrics, checkpoint=None):
        kept = None
        if checkpoint is not None:
            kept = self.folder / f"checkpoint-{metrics['tokens']}"
            shutil.copytree(checkpoint, kept)
        self.reports.append((dict(metrics), kept))

    def get_checkpoint(self):
        if self.resume_from is None:
            return None

        @contextmanager
        def as_directory():
            yield str(self.resume_from)

        return SimpleNamespace(as_directory=as_directory)


def train_here(cfg: Config, folder: Path) -> str:
    """`cfg` (one worker) trained in this process after the driver's checks (run_life.ready), into a
    new MLflow run opened the driver's way (run_life.open_run: params, config artifacts); returns
    its id. The process group of size 1 stays (DeepSpeed keeps its groups, so every run here shares
    it); torch's thread count, which the worker sets, is put back."""
    run_life.ready(cfg)
    run_id = run_life.open_run(Store.of(cfg), cfg, cfg.train.run_name or "run")
    payload = WorkerPayload(config=config.to_dict(cfg, redact=False), run_id=run_id)
    threads = torch.get_num_threads()
    ensure_process_group(cfg)
    try:
        train_loop._train(config.from_dict(payload.config), payload, FakeRay(folder))
    finally:
        torch.set_num_threads(threads)
    return run_id
