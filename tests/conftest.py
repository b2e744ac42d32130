import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "conf" / "train" / "tiny.yaml"


def run_cli(*args, cwd=None, env=None, timeout=600, check=False):
    """The real command line in a subprocess: (returncode, stdout, stderr)."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    proc = subprocess.run(
        [sys.executable, "-m", "orchestrator", *map(str, args)],
        cwd=cwd or ROOT, env=full_env, capture_output=True, text=True, timeout=timeout,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"exit {proc.returncode}\nstdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}")
    return proc.returncode, proc.stdout, proc.stderr


@pytest.fixture
def cli():
    return run_cli
