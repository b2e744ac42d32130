"""GPU throughput: tokens/s and MFU of gpt-350m in bf16 on one GPU, in one process.

    python benchmarks/gpu_throughput.py [--json PATH] [--engine plain|deepspeed|both] [--peak-flops F] [key=value ...]
    python benchmarks/gpu_throughput.py --device cpu --tiny     # smoke check of the logic only

Two engines over the same model (workloads/model.py GPT: on CUDA, compiled flex attention with
a document block mask), the same TokenDataset micro-batches and the same token-weighted loss:
- plain: a nanoGPT-style loop, fp32 weights under bf16 autocast, torch AdamW(fused=True),
  one host sync per optimizer update;
- deepspeed: the trainer's own step, `workloads.engine.train_update` on the engine built by
  `workloads.engine.build_engine` (ZeRO stage and precision from the config, bf16, fused AdamW,
  gradient noise probe as configured), world size 1, no Ray and no MLflow.
One update = the per-worker share of the config's update (b x S x A tokens). Warm-up updates
(flex attention and block-mask compilation, allocator growth) are excluded; tokens/s is over
the measured updates with the device synchronised at each update boundary.
MFU = tokens/s x flops_per_token(model, S) / peak, with flops_per_token = 6N + 12 L H Q S
(workloads.model), which counts full causal attention even where document masking skips it.
Peak: H100/H200 989e12 (bf16 dense), A100 312e12, or --peak-flops.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

DEFAULT_CONFIG = ROOT / "conf" / "train" / "gpt-350m.yaml"
TINY_CONFIG = ROOT / "conf" / "train" / "tiny.yaml"
PEAKS = (("H100", 989e12), ("H200", 989e12), ("GH200", 989e12), ("A100", 312e12))  # bf16 dense, per GPU
NO_CUDA = (
    "gpu_throughput: no CUDA device is visible (torch {torch}, CUDA build {cuda}); this benchmark needs one GPU. "
    "Install the CUDA build of torch (README, GPU install) on a GPU machine, or run "
    "`--device cpu --tiny` for a smoke check of the benchmark's logic (no meaningful figure)."
)


def detect_peak(name: str) -> Optional[float]:
    for key, peak in PEAKS:
        if key in name:
            return peak
    return None


def load_config(args):
    """The config with one worker doing the per-worker share of the configured update."""
    from orchestrator import config
    from orchestrator.config import batch_plan

    path = TINY_CONFIG if args.tiny else Path(args.config)
    cfg = config.load(path, args.overrides)
    plan = batch_plan(cfg)
    per_worker = plan.tokens_per_update // plan.num_workers
    precision = args.precision or ("bf16" if args.device == "cuda" else "fp32")
    return config.load(
        path,
        [
            *args.overrides,
            "cluster.num_workers=1",
            f"batch.tokens_per_update={per_worker}",
            f"batch.micro_batch_size={plan.micro_batch_size}",
            f"batch.grad_accum_steps={plan.grad_accum_steps}",
            f"cluster.use_gpu={str(args.device == 'cuda').lower()}",
            f"deepspeed.precision={precision}",
        ],
    )


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _measure(step, device, warmup: int, steps: int, max_seconds: float, label: str) -> Dict[str, Any]:
    """Run `step(update)` for warm-up then measured updates; per-update wall times."""
    started = time.perf_counter()
    for u in range(warmup):
        t = time.perf_counter()
        step(u)
        _sync(device)
        print(f"  {label} warm-up {u + 1}/{warmup}: {time.perf_counter() - t:.2f} s", flush=True)
    times: List[float] = []
    for u in range(warmup, warmup + steps):
        t = time.perf_counter()
        step(u)
        _sync(device)
        times.append(time.perf_counter() - t)
        if time.perf_counter() - started > max_seconds and len(times) >= 2:
            print(f"  {label}: time limit reached after {len(times)} measured updates", flush=True)
            break
    return {
        "update_s": times,
        "warmup_updates": warmup,
        "measured_updates": len(times),
        "elapsed_s": time.perf_counter() - started,
    }


def _release(device) -> None:
    """Free what a finished run_plain/run_deepspeed left behind (reference cycles, cached device memory)."""
    import torch

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def run_plain(cfg, device, args) -> Dict[str, Any]:
    import torch

    from orchestrator.config import batch_plan
    from workloads import model as gpt
    from workloads.data import TokenDataset

    plan = batch_plan(cfg)
    torch.manual_seed(cfg.train.seed)
    model = gpt.GPT(cfg.model).to(device)
    o = cfg.optim
    opt = torch.optim.AdamW(
        gpt.param_groups(model, o.weight_decay),
        lr=o.lr,
        betas=(o.beta1, o.beta2),
        eps=o.eps,
        fused=device.type == "cuda" or None,
    )
    data = TokenDataset(cfg, "train")
    bf16 = cfg.deepspeed.precision == "bf16"

    def step(update: int) -> None:
        batches = [data.micro_batch(update, plan, 0, a) for a in range(plan.grad_accum_steps)]
        real = max(sum(b.real_tokens for b in batches), 1)
        total = torch.zeros((), device=device)
        for b in batches:
            t = {
                k: getattr(b, k).to(device, non_blocking=True)
                for k in ("inputs", "targets", "positions", "doc_ids", "loss_mask")
            }
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
                logits = model(t["inputs"], t["positions"], t["doc_ids"])
            summed, _ = gpt.token_losses(logits, t["targets"], t["loss_mask"])
            (summed / real).backward()
            total += summed.detach()
        if o.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), o.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        float(total)  # one host sync per update, as a logging loop has

    return _measure(step, device, args.warmup, args.steps, args.max_seconds, "plain")


def run_deepspeed(cfg, device, args) -> Dict[str, Any]:
    import torch

    from orchestrator.config import batch_plan
    from workloads import workload as workloads
    from workloads.engine import build_engine, ensure_process_group, train_update
    from workloads.gns_probe import GradNormProbe

    ensure_process_group(cfg)  # a world of one, as in Ray Train's local mode
    if device.type == "cuda":
        torch.cuda.set_device(device)
    plan = batch_plan(cfg)
    work = workloads.build(cfg, plan, device)
    probe = GradNormProbe(work.model) if cfg.gns.enabled and plan.micro_batches_per_update > 1 else None
    engine = build_engine(cfg, plan, work)

    def step(update: int) -> None:
        train_update(engine, work, plan, update, 0, probe)

    try:
        return _measure(step, device, args.warmup, args.steps, args.max_seconds, "deepspeed")
    finally:
        if probe:
            probe.remove()


def summarise(
    run: Dict[str, Any], tokens_per_update: int, flops_per_token: float, peak: Optional[float]
) -> Dict[str, Any]:
    times = run["update_s"]
    tokens_per_s = tokens_per_update * len(times) / sum(times)
    run.update(
        tokens_per_s=tokens_per_s,
        median_update_s=statistics.median(times),
        mfu=tokens_per_s * flops_per_token / peak if peak else None,
    )
    return run


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides (OmegaConf dotlist)")
    p.add_argument("--config", default=str(DEFAULT_CONFIG), help="train config (default conf/train/gpt-350m.yaml)")
    p.add_argument("--engine", choices=["plain", "deepspeed", "both"], default="both")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--tiny", action="store_true", help="conf/train/tiny.yaml instead (smoke check, with --device cpu)")
    p.add_argument("--precision", choices=["bf16", "fp32"], default=None, help="default bf16 on cuda, fp32 on cpu")
    p.add_argument("--warmup", type=int, default=3, help="updates excluded from the figure")
    p.add_argument("--steps", type=int, default=10, help="measured updates")
    p.add_argument(
        "--max-seconds", type=float, default=100.0, help="per engine, warm-up included; stops measuring early"
    )
    p.add_argument("--peak-flops", type=float, default=None, help="peak FLOP/s of the device (default: detected)")
    p.add_argument("--json", default=None, help="write the results here")
    args = p.parse_args(argv)

    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        message = NO_CUDA.format(torch=torch.__version__, cuda=torch.version.cuda)
        print(message, file=sys.stderr)
        if args.json:
            Path(args.json).write_text(
                json.dumps({"benchmark": "gpu_throughput", "measured": False, "reason": message}, indent=2)
            )
        return 2

    from orchestrator.config import batch_plan
    from workloads import model as gpt

    started = time.perf_counter()
    cfg = load_config(args)
    plan = batch_plan(cfg)
    device = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    if device.type == "cpu":  # as train_worker: the CPUs a worker is given, not every core of a shared machine
        torch.set_num_threads(max(1, int(cfg.cluster.cpus_per_worker)))
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    peak = args.peak_flops or (detect_peak(name) if device.type == "cuda" else None)
    if peak is None:
        print(f"no known peak for {name!r}: MFU is not computed (pass --peak-flops)", flush=True)
    fpt = gpt.flops_per_token(cfg.model, cfg.data.seq_len)
    tokens_per_update = plan.tokens_per_update
    print(
        f"{name}: {Path(TINY_CONFIG if args.tiny else args.config).name}, "
        f"{gpt.count_params(cfg.model) / 1e6:.1f}M params, "
        f"S={cfg.data.seq_len} b={plan.micro_batch_size} A={plan.grad_accum_steps} "
        f"({tokens_per_update:,} tokens/update), "
        f"{cfg.deepspeed.precision}, {fpt / 1e9:.2f} GFLOP/token",
        flush=True,
    )
    from workloads import data

    data.check_corpus(cfg, tokens_per_update)  # tokenizes the corpus once, outside the timing

    engines = ["plain", "deepspeed"] if args.engine == "both" else [args.engine]
    results: Dict[str, Any] = {}
    for engine in engines:
        try:
            run = (run_plain if engine == "plain" else run_deepspeed)(cfg, device, args)
            results[engine] = summarise(run, tokens_per_update, fpt, peak)
        except Exception as exc:  # one engine failing must not hide the other's figure
            results[engine] = {"error": f"{type(exc).__name__}: {exc}"}
            print(f"  {engine} failed: {results[engine]['error']}", flush=True)
        _release(device)  # the engine's model and optimizer, unreferenced once run_* has returned
        if device.type == "cuda" and "error" not in results[engine]:
            results[engine]["max_memory_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
            torch.cuda.reset_peak_memory_stats(device)

    print()
    print(f"{'engine':10s} {'tokens/s':>12s} {'MFU':>7s} {'median update s':>16s} {'updates':>8s}")
    for engine, r in results.items():
        if "error" in r:
            print(f"{engine:10s} failed: {r['error']}")
            continue
        mfu = f"{100 * r['mfu']:.1f}%" if r["mfu"] is not None else "-"
        print(
            f"{engine:10s} {r['tokens_per_s']:12,.0f} {mfu:>7s} {r['median_update_s']:16.3f} {r['measured_updates']:8d}"
        )
    ok = [r for r in results.values() if "error" not in r]
    result = {
        "benchmark": "gpu_throughput",
        "measured": bool(ok),
        "smoke_check": args.device == "cpu",
        "tokens_per_s": max((r["tokens_per_s"] for r in ok), default=None),
        "engines": results,
        "device": name,
        "peak_flops": peak,
        "flops_per_token": fpt,
        "config": {
            "file": "conf/train/tiny.yaml" if args.tiny else os.path.relpath(args.config, ROOT),
            "overrides": args.overrides,
            "seq_len": cfg.data.seq_len,
            "micro_batch_size": plan.micro_batch_size,
            "grad_accum_steps": plan.grad_accum_steps,
            "precision": cfg.deepspeed.precision,
            "zero_stage": cfg.deepspeed.zero_stage,
            "gns": cfg.gns.enabled,
        },
        "torch": torch.__version__,
        "wall_s": time.perf_counter() - started,
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }
    if "plain" in results and "deepspeed" in results and len(ok) == 2:
        result["ratio_deepspeed_over_plain"] = results["deepspeed"]["tokens_per_s"] / results["plain"]["tokens_per_s"]
        print(f"deepspeed / plain: {result['ratio_deepspeed_over_plain']:.3f}")
    print(f"wall {result['wall_s']:.0f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
        print(f"wrote {args.json}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
