"""First update of a compiled model in a fresh process, with a cold and then a warm compile cache:
what the second trial of a sweep on the same node pays (issue 14's goal: under 5 s on GPU).

    python benchmarks/compile_cache.py [--device cuda|cpu] [--config PATH] [--json PATH] [key=value ...]

Runs `benchmarks/gpu_throughput.py --engine deepspeed model.compile=true` twice, each in its own
process (as two trials are), sharing one new TORCHINDUCTOR_CACHE_DIR, and reads each one's first
update time. On CPU it uses the tiny config, where inductor's C++ kernels take the place of Triton's.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import List, Optional

ROOT = Path(__file__).resolve().parents[1]


def first_update_s(args, cache_dir: str, out: Path) -> float:
    command = [
        sys.executable,
        str(ROOT / "benchmarks" / "gpu_throughput.py"),
        "--engine",
        "deepspeed",
        "--device",
        args.device,
        "--warmup",
        "1",
        "--steps",
        "2",
        "--json",
        str(out),
        *(["--tiny"] if args.device == "cpu" else ["--config", args.config]),
        "model.compile=true",
        *args.overrides,
    ]
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache_dir}
    subprocess.run(command, check=True, env=env, cwd=ROOT, stdout=subprocess.DEVNULL)
    (result,) = json.loads(out.read_text())["configs"].values()
    return result["engines"]["deepspeed"]["first_update_s"]


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("overrides", nargs="*", metavar="key=value")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--config", default=str(ROOT / "conf" / "train" / "gpt-350m.yaml"), help="GPU only")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        cache = str(Path(tmp) / "inductor")
        cold = first_update_s(args, cache, Path(tmp) / "cold.json")
        warm = first_update_s(args, cache, Path(tmp) / "warm.json")
    result = {
        "benchmark": "compile_cache",
        "device": args.device,
        "config": "conf/train/tiny.yaml" if args.device == "cpu" else os.path.relpath(args.config, ROOT),
        "first_update_cold_s": cold,
        "first_update_warm_s": warm,
        "ratio_warm_over_cold": warm / cold,
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }
    print(f"first update, cold cache {cold:.1f} s; warm cache (a later trial) {warm:.1f} s; ratio {warm / cold:.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
