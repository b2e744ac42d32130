"""What a user would write instead of `orchestrator sweep`: a Ray Tune function trainable running a
plain PyTorch loop, with Tune's MLflowLoggerCallback. The baseline of `sweep_overhead.py --plain`.

    python benchmarks/plain_tune.py --uri sqlite:///PATH/mlflow.db [--trials 2] [--concurrency 2] [key=value ...]

The same model, token stream, token-weighted loss, AdamW with the same parameter groups,
schedule, clipping and evaluations as the trainer's on conf/train/tiny.yaml (_common.PlainLoop,
also `trainer_overhead.run_plain`'s), one torch thread per trial, N learning rates; each trial reports
its loss (and evaluation) to Tune every `train.report_every_tokens`, which logs them to MLflow.
No DeepSpeed, no checkpoints, no analysis: the least a user would run.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Dict, List

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks import _common as common  # noqa: E402


def plain_trial(params: Dict[str, Any]) -> None:
    import torch
    from ray import tune

    from orchestrator.core import config

    cfg = config.load(str(ROOT / "conf" / "train" / "tiny.yaml"), [*params["overrides"], f"optim.lr={params['lr']}"])
    torch.set_num_threads(1)
    loop = common.PlainLoop(cfg)
    eval_loss, tokens, losses = loop.evaluate(), 0, []
    for update in range(loop.steps):
        before = tokens
        losses.append(loop.update(update, before))
        tokens += loop.plan.tokens_per_update
        last = update + 1 == loop.steps
        if common.due(before, tokens, cfg.train.eval_every_tokens) or last:
            eval_loss = loop.evaluate()
        if common.due(before, tokens, cfg.train.report_every_tokens) or last:
            tune.report({"tokens": tokens, "loss": sum(losses) / len(losses), "eval_loss": eval_loss})
            losses = []


def main(argv: List[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("overrides", nargs="*", metavar="key=value", help="overrides of conf/train/tiny.yaml")
    p.add_argument("--uri", required=True, help="MLflow tracking URI")
    p.add_argument("--trials", type=int, default=2)
    p.add_argument("--concurrency", type=int, default=2)
    p.add_argument("--storage", default=None, help="Tune's storage path (default: a temporary folder)")
    args = p.parse_args(argv)

    import tempfile

    import ray
    from ray import cloudpickle, tune
    from ray.air.integrations.mlflow import MLflowLoggerCallback

    cloudpickle.register_pickle_by_value(common)  # a trial's process need not find benchmarks/
    ray.init(dashboard_host="127.0.0.1", _node_ip_address="127.0.0.1", log_to_driver=False)  # as the sweep's
    lrs = [round(2e-3 + 1e-3 * i, 6) for i in range(args.trials)]
    tuner = tune.Tuner(
        tune.with_resources(plain_trial, {"cpu": 1}),
        param_space={"lr": tune.grid_search(lrs), "overrides": list(args.overrides)},
        tune_config=tune.TuneConfig(max_concurrent_trials=args.concurrency),
        run_config=tune.RunConfig(
            name="plain-tune",
            storage_path=args.storage or tempfile.mkdtemp(prefix="plain-tune-"),
            callbacks=[MLflowLoggerCallback(tracking_uri=args.uri, experiment_name="plain-tune")],
            verbose=0,
        ),
    )
    results = tuner.fit()
    errors = [r.error for r in results if r.error]
    for r in results:
        print(f"lr {r.config['lr']:g}: eval loss {r.metrics.get('eval_loss', float('nan')):.4f}")
    ray.shutdown()
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
