"""The memory model (orchestrator/formulas/memory.py) against the measured peak of live tensor bytes of
real DeepSpeed updates on CPU, at every ZeRO stage, for a model big enough that its states and
activations are what the process holds (about 350 MB; the tiny config is allocator noise)."""

import json
import subprocess
import sys

import pytest

from orchestrator.formulas import memory
from tests.conftest import ROOT, TINY

pytestmark = pytest.mark.slow

MEASURE = """
import json, sys
import torch
from orchestrator.core import config
from orchestrator.driver import micro_batch
from tests.conftest import zero_stage
from workloads.train.engine import ensure_process_group
from workloads.train.micro_batch_probe import peak_at

torch.set_num_threads(2)
out = {}
for stage in (0, 1, 2, 3):
    cfg = config.load(sys.argv[1], sys.argv[2:] + zero_stage(stage))
    ensure_process_group(cfg)
    measured = peak_at(cfg, 4, torch.device("cpu"))  # two updates of A = 2 micro-batches of 4
    estimate, _ = micro_batch.predict(cfg, 4)
    out[stage] = {"measured": measured, "predicted": estimate.total}
print("RESULT " + json.dumps(out))
"""


def test_predicted_peak_is_within_tolerance_of_the_measured_one_at_every_zero_stage():
    overrides = [
        "model.n_layers=4",
        "model.d_model=512",
        "model.n_heads=8",
        "model.max_seq_len=256",
        "data.seq_len=256",
        "deepspeed.precision=fp32",
    ]
    proc = subprocess.run(
        [sys.executable, "-c", MEASURE, str(TINY), *overrides],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(lines[0][len("RESULT ") :])
    print(result)
    for stage, r in result.items():
        assert r["measured"] > 300e6, f"ZeRO {stage}: the model is too small to test the model"
        error = r["predicted"] / r["measured"] - 1
        assert abs(error) <= memory.TOLERANCE, (
            f"ZeRO {stage}: predicted {r['predicted']:.3g}, measured {r['measured']:.3g}"
        )
