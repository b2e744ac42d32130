"""The memory model (orchestrator/formulas/memory.py) against the measured peak of one worker, at every
ZeRO stage: on GPU the allocator's max_memory_allocated, on CPU the profiler's live tensor bytes
(workloads/train/peak_memory.py). Each point: building the engine and two updates of A = 2 micro-batches
of b (workloads/micro_batch_probe.peak_at), one worker.

    python benchmarks/memory_model.py [--device cuda|cpu] [--micro-batch N] [--json PATH]

GPU: gpt-125m and gpt-350m in bf16 (goal: within 15 %). CPU: the tiny config and a 4-block,
512-wide model in fp32.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import List, Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CPU_CASES = {
    "tiny": ["model.n_layers=2"],
    "4x512": ["model.n_layers=4", "model.d_model=512", "model.n_heads=8", "model.max_seq_len=256", "data.seq_len=256"],
}


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--micro-batch", type=int, default=None, help="b (default 8 on GPU, 4 on CPU)")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)

    import torch

    from orchestrator.core import config
    from orchestrator.driver import micro_batch
    from orchestrator.formulas import memory
    from workloads.train.engine import ensure_process_group
    from workloads.train.micro_batch_probe import peak_at

    device = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        cases = {name: (ROOT / "conf" / "train" / f"{name}.yaml", []) for name in ("gpt-125m", "gpt-350m")}
        common = ["deepspeed.precision=bf16", "cluster.use_gpu=true", "model.compile=false"]
    else:
        torch.set_num_threads(2)
        cases = {name: (ROOT / "conf" / "train" / "tiny.yaml", o) for name, o in CPU_CASES.items()}
        common = ["deepspeed.precision=fp32"]
    b = args.micro_batch or (8 if device.type == "cuda" else 4)
    rows = []
    print(f"{'config':10s} {'ZeRO':>4s} {'b':>3s} {'measured':>12s} {'model':>12s} {'model/measured':>15s}")
    for name, (path, overrides) in cases.items():
        for stage in (0, 1, 2, 3):
            cfg = config.load(path, [*overrides, *common, f"deepspeed.zero_stage={stage}", "cluster.num_workers=1"])
            ensure_process_group(cfg)
            measured = peak_at(cfg, b, device)
            predicted = micro_batch.predict(cfg, b)[0].total
            ratio = predicted / measured if measured else float("nan")
            rows.append({"config": name, "zero_stage": stage, "b": b, "measured": measured, "predicted": predicted})
            print(
                f"{name:10s} {stage:4d} {b:3d} {memory.format_bytes(measured or 0):>12s} "
                f"{memory.format_bytes(predicted):>12s} {ratio:15.3f}",
                flush=True,
            )
    worst = max(abs(r["predicted"] / r["measured"] - 1) for r in rows if r["measured"])
    print(f"largest error {worst:.1%} (goal {memory.TOLERANCE:.0%})")
    if args.json:
        result = {"benchmark": "memory_model", "device": str(device), "rows": rows, "largest_error": worst}
        result["date"] = time.strftime("%Y-%m-%d %H:%M:%S %Z")
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
