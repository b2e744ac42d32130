"""benchmarks/gpu_throughput.py runs where only torch, DeepSpeed and OmegaConf are installed (the
GPU machine it is meant for has no Ray and no MLflow): here, with both made unimportable."""

import json
import subprocess
import sys

from tests.conftest import ROOT

WITHOUT_RAY_AND_MLFLOW = """
import runpy, sys
sys.modules["ray"] = None  # any import of them now fails
sys.modules["mlflow"] = None
sys.argv = ["gpu_throughput.py", *sys.argv[1:]]
runpy.run_path("benchmarks/gpu_throughput.py", run_name="__main__")
"""


def test_gpu_throughput_needs_neither_ray_nor_mlflow(tmp_path):
    out = tmp_path / "result.json"
    args = ["--device", "cpu", "--tiny", "--warmup", "1", "--steps", "1", "--json", str(out)]
    proc = subprocess.run(
        [sys.executable, "-c", WITHOUT_RAY_AND_MLFLOW, *args], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    result = json.loads(out.read_text())
    (tiny,) = result["configs"].values()
    assert result["measured"] and tiny["micro_batch"]["method"] == "memory model"  # auto, on CPU
    assert {"plain", "deepspeed"} == set(tiny["engines"]) and all("tokens_per_s" in e for e in tiny["engines"].values())
