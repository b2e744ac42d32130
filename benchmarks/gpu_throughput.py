"""GPU throughput: tokens/s, MFU and peak memory of gpt-125m and gpt-350m in bf16 on one GPU, at the
micro-batch `batch.micro_batch_size: auto` finds, in one process.

    python benchmarks/gpu_throughput.py [--json PATH] [--engine plain|deepspeed|both] [--peak-flops F]
        [--config conf/train/gpt-350m.yaml ...] [--micro-batch auto|N] [key=value ...]
    python benchmarks/gpu_throughput.py --device cpu --tiny     # smoke check of the logic only

Needs torch, DeepSpeed and OmegaConf, not Ray or MLflow (so it runs on a GPU machine with only
those wheels). For each config: the probe of workloads/train/micro_batch_probe.py picks b (on CPU, the
memory model does), then both engines run at that b; the memory model's prediction is printed
beside the measured peak.

Two engines over the same model (workloads/builtin/gpt.py GPT: on CUDA, compiled flex attention with
a document block mask), the same TokenDataset micro-batches and the same token-weighted loss:
- plain: a nanoGPT-style loop, fp32 weights under bf16 autocast, torch AdamW(fused=True), the
  model compiled when the trainer would compile it (`model.compile`), one host sync per update;
- deepspeed: the trainer's own step, `workloads.train.engine.train_update` on the engine built by
  `workloads.train.engine.build_engine` (ZeRO stage and precision from the config, bf16, fused AdamW,
  gradient noise probe as configured), world size 1, no Ray and no MLflow.
One update = the per-worker share of the config's update (b x S x A tokens). Warm-up updates
(flex attention and block-mask compilation, allocator growth) are excluded; tokens/s is over
the measured updates with the device synchronised at each update boundary.
MFU = tokens/s x flops_per_token(model, S) / peak, with flops_per_token = 6N + 12 L H Q S
(workloads.builtin.gpt), which counts full causal attention even where document masking skips it.
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

DEFAULT_CONFIGS = [ROOT / "conf" / "train" / "gpt-125m.yaml", ROOT / "conf" / "train" / "gpt-350m.yaml"]
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


def load_config(path: Path, args):
    """The config with one worker doing the per-worker share of the configured update, at
    micro-batch `args.micro_batch` (auto: resolved by `choose_micro_batch`)."""
    from orchestrator.core import config
    from orchestrator.core.derived import batch_plan

    cfg = config.load(path, args.overrides)
    plan = batch_plan(cfg)
    per_worker = plan.tokens_per_update // plan.num_workers
    micro = args.micro_batch or cfg.batch.micro_batch_size
    precision = args.precision or ("bf16" if args.device == "cuda" else "fp32")
    return config.load(
        path,
        [
            *args.overrides,
            "cluster.num_workers=1",
            f"batch.tokens_per_update={per_worker}",
            f"batch.micro_batch_size={micro}",
            "batch.grad_accum_steps=null",
            f"cluster.use_gpu={str(args.device == 'cuda').lower()}",
            f"deepspeed.precision={precision}",
        ],
    )


def choose_micro_batch(cfg, device, args) -> Dict[str, Any]:
    """Resolve `auto` as a run would: the probe on a GPU, the memory model on CPU."""
    from orchestrator.core.config import to_dict
    from orchestrator.core.schema import AUTO
    from orchestrator.driver import micro_batch

    if cfg.batch.micro_batch_size != AUTO:
        return {"micro_batch_size": cfg.batch.micro_batch_size, "method": "given"}
    share = micro_batch.per_worker_share(cfg)
    started = time.perf_counter()
    if device.type == "cuda":
        from workloads.train.micro_batch_probe import probe

        answer = probe(to_dict(cfg, redact=False), share)
    else:
        answer = micro_batch.from_model(cfg, micro_batch.cpu_worker_memory(cfg), share)
    answer["seconds"] = time.perf_counter() - started
    cfg.batch.micro_batch_size = answer["micro_batch_size"]
    return answer


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _measure(step, device, warmup: int, steps: int, max_seconds: float, label: str) -> Dict[str, Any]:
    """Run `step(update)` for warm-up then measured updates; per-update wall times."""
    started = time.perf_counter()
    warmup_s: List[float] = []
    for u in range(warmup):
        t = time.perf_counter()
        step(u)
        _sync(device)
        warmup_s.append(time.perf_counter() - t)
        print(f"  {label} warm-up {u + 1}/{warmup}: {warmup_s[-1]:.2f} s", flush=True)
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
        "warmup_s": warmup_s,  # the first: compilation of the model (and of its attention)
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

    from orchestrator.core.derived import adamw_constants, batch_plan, compile_enabled
    from workloads.builtin import gpt
    from workloads.text.packing import TokenDataset

    plan = batch_plan(cfg)
    torch.manual_seed(cfg.train.seed)
    model = gpt.GPT(cfg.model).to(device)
    if compile_enabled(cfg):  # as the trainer does (workloads/train/engine.py)
        model.compile()
    o, constants = cfg.optim, adamw_constants(cfg)  # beta2 and weight decay as the trainer resolves them
    opt = torch.optim.AdamW(
        gpt.param_groups(model, constants.weight_decay),
        lr=o.lr,
        betas=(o.beta1, constants.beta2),
        eps=o.eps,
        fused=device.type == "cuda" or None,
    )
    data = TokenDataset(cfg, "train")
    bf16 = cfg.deepspeed.precision == "bf16"

    def step(update: int) -> None:
        batches = [
            data.micro_batch(update * plan.sequences_per_update, plan, 0, a) for a in range(plan.grad_accum_steps)
        ]
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

    from orchestrator.core.derived import batch_plan, measures_adam_noise_scale
    from workloads import workload as workloads
    from workloads.train.adam_precondition import AdamPreconditioner
    from workloads.train.engine import build_engine, ensure_process_group, train_update
    from workloads.train.gns_probe import GradNormProbe

    ensure_process_group(cfg)  # a world of one, as in Ray Train's local mode
    if device.type == "cuda":
        torch.cuda.set_device(device)
    plan = batch_plan(cfg)
    work = workloads.build(cfg, plan, device)
    probe = GradNormProbe(work.model) if cfg.gns.enabled and plan.micro_batches_per_update > 1 else None
    engine = build_engine(cfg, plan, work)
    if probe and measures_adam_noise_scale(cfg):  # as train_worker does: gns/b_simple_adam's preconditioner
        probe.adam = AdamPreconditioner(engine, probe.params)

    def step(update: int) -> None:
        train_update(engine, work, plan, update * plan.sequences_per_update, 0, probe)

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
        first_update_s=run["warmup_s"][0] if run["warmup_s"] else float("nan"),
        median_update_s=statistics.median(times),
        mfu=tokens_per_s * flops_per_token / peak if peak else None,
    )
    return run


def measure_config(path: Path, args, device, name: str, peak: Optional[float]) -> Dict[str, Any]:
    """Both engines on one config at the micro-batch auto picks: tokens/s, MFU, peak memory."""
    import torch

    from orchestrator.core.derived import batch_plan
    from orchestrator.driver import micro_batch
    from orchestrator.formulas import memory
    from workloads.builtin import gpt
    from workloads.text import packing

    started = time.perf_counter()
    cfg = load_config(path, args)
    chosen = choose_micro_batch(cfg, device, args)
    plan = batch_plan(cfg)
    predicted, _ = micro_batch.predict(cfg, plan.micro_batch_size)
    fpt = gpt.flops_per_token(cfg.model, cfg.data.seq_len)
    tokens_per_update = plan.tokens_per_update
    print(
        f"{name}: {path.name}, {gpt.count_params(cfg.model) / 1e6:.1f}M params, "
        f"S={cfg.data.seq_len} b={plan.micro_batch_size} ({chosen['method']}) A={plan.grad_accum_steps} "
        f"({tokens_per_update:,} tokens/update), {cfg.deepspeed.precision}, ZeRO {cfg.deepspeed.zero_stage}, "
        f"{fpt / 1e9:.2f} GFLOP/token; memory model {memory.format_bytes(predicted.total)}",
        flush=True,
    )
    packing.check_corpus(cfg, tokens_per_update)  # tokenizes the corpus once, outside the timing

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
    result = {
        "engines": results,
        "micro_batch": chosen,
        "predicted_memory_gib": predicted.total / 2**30,
        "flops_per_token": fpt,
        "config": {
            "file": os.path.relpath(path, ROOT),
            "overrides": args.overrides,
            "seq_len": cfg.data.seq_len,
            "micro_batch_size": plan.micro_batch_size,
            "grad_accum_steps": plan.grad_accum_steps,
            "precision": cfg.deepspeed.precision,
            "zero_stage": cfg.deepspeed.zero_stage,
            "compile": cfg.model.compile,
            "gns": cfg.gns.enabled,
        },
        "wall_s": time.perf_counter() - started,
    }
    ok = [r for r in results.values() if "error" not in r]
    if len(ok) == 2:
        result["ratio_deepspeed_over_plain"] = results["deepspeed"]["tokens_per_s"] / results["plain"]["tokens_per_s"]
    return result


def _print_table(per_config: Dict[str, Dict[str, Any]]) -> None:
    print()
    header = f"{'config':16s} {'engine':10s} {'b':>4s} {'tokens/s':>12s} {'MFU':>7s} {'first s':>8s}"
    print(header + f" {'median s':>9s} {'peak GiB':>9s} {'model GiB':>9s}")
    for label, r in per_config.items():
        b = r["config"]["micro_batch_size"]
        for engine, e in r["engines"].items():
            if "error" in e:
                print(f"{label:16s} {engine:10s} failed: {e['error']}")
                continue
            mfu = f"{100 * e['mfu']:.1f}%" if e["mfu"] is not None else "-"
            peak = f"{e['max_memory_gib']:.1f}" if "max_memory_gib" in e else "-"
            print(
                f"{label:16s} {engine:10s} {b:4d} {e['tokens_per_s']:12,.0f} {mfu:>7s} {e['first_update_s']:8.1f} "
                f"{e['median_update_s']:9.3f} {peak:>9s} {r['predicted_memory_gib']:9.1f}"
            )
        if "ratio_deepspeed_over_plain" in r:
            print(f"{label:16s} deepspeed / plain: {r['ratio_deepspeed_over_plain']:.3f}")


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides (OmegaConf dotlist)")
    p.add_argument(
        "--config", action="append", default=None, help="train config, repeatable (default gpt-125m and gpt-350m)"
    )
    p.add_argument("--micro-batch", default="auto", help="b: auto (default: probed on the GPU) or a number")
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

    started = time.perf_counter()
    device = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    if device.type == "cpu":  # as train_worker: the CPUs a worker is given, not every core of a shared machine
        torch.set_num_threads(1)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    peak = args.peak_flops or (detect_peak(name) if device.type == "cuda" else None)
    if peak is None:
        print(f"no known peak for {name!r}: MFU is not computed (pass --peak-flops)", flush=True)
    paths = [TINY_CONFIG] if args.tiny else [Path(c) for c in args.config or DEFAULT_CONFIGS]
    per_config = {path.stem: measure_config(path, args, device, name, peak) for path in paths}
    _print_table(per_config)
    measured = [e for r in per_config.values() for e in r["engines"].values() if "error" not in e]
    result = {
        "benchmark": "gpu_throughput",
        "measured": bool(measured),
        "smoke_check": args.device == "cpu",
        "configs": per_config,
        "device": name,
        "peak_flops": peak,
        "torch": torch.__version__,
        "wall_s": time.perf_counter() - started,
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }
    print(f"wall {result['wall_s']:.0f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
        print(f"wrote {args.json}")
    return 0 if measured else 1


if __name__ == "__main__":
    sys.exit(main())
