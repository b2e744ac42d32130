"""What a user would write instead of `orchestrator sweep`: a Ray Tune function trainable running a
plain PyTorch loop, with Tune's MLflowLoggerCallback. The baseline of `sweep_overhead.py --plain`.

    python benchmarks/plain_tune.py --uri sqlite:///PATH/mlflow.db [--trials 2] [--concurrency 2] [key=value ...]

The same model, token stream, token-weighted loss, AdamW with the same parameter groups,
schedule, clipping and evaluations as the trainer's on conf/train/tiny.yaml (the loop of
`trainer_overhead.run_plain`), one torch thread per trial, N learning rates; each trial reports
its loss (and evaluation) to Tune every `train.report_every_tokens`, which logs them to MLflow.
No DeepSpeed, no checkpoints, no analysis: the least a user would run.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any, Dict, List

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def plain_trial(params: Dict[str, Any]) -> None:
    import torch
    from ray import tune

    from orchestrator.core import config, derived
    from orchestrator.formulas import batching
    from orchestrator.formulas.schedules import lr_at
    from workloads.builtin import gpt
    from workloads.text.packing import TokenDataset

    cfg = config.load(str(ROOT / "conf" / "train" / "tiny.yaml"), [*params["overrides"], f"optim.lr={params['lr']}"])
    torch.set_num_threads(1)
    plan = derived.batch_plan(cfg)
    steps = batching.total_steps(plan, cfg.train.total_tokens)
    budget = plan.tokens_for_steps(steps)
    torch.manual_seed(cfg.train.seed)
    model = gpt.GPT(cfg.model)
    train, held = TokenDataset(cfg, "train"), TokenDataset(cfg, "eval")
    o, constants = cfg.optim, derived.adamw_constants(cfg)
    opt = torch.optim.AdamW(
        gpt.param_groups(model, constants.weight_decay), lr=o.lr, betas=(o.beta1, constants.beta2), eps=o.eps
    )

    def loss_of(batch):
        return gpt.token_losses(model(batch.inputs, batch.positions, batch.doc_ids), batch.targets, batch.loss_mask)

    @torch.no_grad()
    def evaluate() -> float:
        model.eval()
        total, count = 0.0, 0.0
        for batch in held.eval_batches(cfg.train.eval_tokens, plan.micro_batch_size):
            s, n = loss_of(batch)
            total, count = total + float(s), count + float(n)
        model.train()
        return total / max(count, 1.0)

    eval_loss, tokens, losses = evaluate(), 0, []
    for update in range(steps):
        before = tokens
        for group in opt.param_groups:
            group["lr"] = lr_at(
                before + plan.tokens_per_update,
                peak=o.lr,
                total_tokens=budget,
                warmup_tokens=cfg.schedule.warmup_tokens,
                decay=cfg.schedule.decay,
                min_lr_ratio=cfg.schedule.min_lr_ratio,
                wsd_decay_share=cfg.schedule.wsd_decay_share,
            )
        batches = [
            train.micro_batch(update * plan.sequences_per_update, plan, 0, a) for a in range(plan.grad_accum_steps)
        ]
        real = max(sum(b.real_tokens for b in batches), 1)
        loss = 0.0
        for batch in batches:
            summed, _ = loss_of(batch)
            (summed / real).backward()
            loss += float(summed.detach()) / real
        if o.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), o.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        tokens += plan.tokens_per_update
        losses.append(loss)
        every = cfg.train.eval_every_tokens
        if (every and tokens // every > before // every) or update + 1 == steps:
            eval_loss = evaluate()
        every = cfg.train.report_every_tokens
        if (every and tokens // every > before // every) or update + 1 == steps:
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
    from ray import tune
    from ray.air.integrations.mlflow import MLflowLoggerCallback

    os.environ.setdefault("ORCHESTRATOR_CACHE_DIR", str(ROOT / ".cache" / "tokens"))
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
