"""A branch study end to end (conf/sweep/branches.yaml, smaller): the base run trains first and
keeps a checkpoint at each branch point; the branches restore it and train on at 1, 2 and 4 x
its batch; the factor-1 branch is the base's own continuation, value for value; `report` gives
the critical batch size at every branch point, the power law, the plot and a ramp `plan` accepts."""

import json

import pytest
import yaml

from orchestrator import tracking
from orchestrator.cli import main
from tests.conftest import ROOT, run_cli

pytestmark = pytest.mark.slow
AT, TOKENS, B = [8192, 32768], 8192, 256


def study(tmp_path):
    body = yaml.safe_load((ROOT / "conf" / "sweep" / "branches.yaml").read_text())
    body["base"]["config"] = str(ROOT / "conf" / "train" / "tiny.yaml")
    body["base"]["overrides"].update(
        {"train.total_tokens": 49152, "train.eval_every_tokens": 8192, "train.eval_tokens": 16384}
    )
    body["branch"].update({"at_tokens": AT, "factors": [1, 2, 4], "tokens": TOKENS})
    path = tmp_path / "branches.yaml"
    path.write_text(yaml.safe_dump(body))
    return path


def test_a_branch_study_measures_the_critical_batch_size_along_training(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    path = study(tmp_path)
    code, out, err = run_cli("sweep", path, f"tracking.uri={uri}", cwd=tmp_path)
    assert code == 0, out[-3000:] + err[-3000:]
    assert "Critical batch size along training:" in out and "Suggested batch ramp" in out

    parent = tracking.find_sweep_run(uri, "orchestrator", "branches")
    runs = tracking.child_runs(uri, parent)
    (base,) = [r for r in runs if r.data.tags.get(tracking.ROLE_TAG) == "branch-base"]
    branches = [r for r in runs if r is not base]
    assert len(branches) == len(AT) * 3 and all(r.info.status == "FINISHED" for r in runs)
    for r in branches:
        at = int(r.data.tags[tracking.BRANCH_AT_TAG])
        assert r.data.tags[tracking.BRANCH_OF_TAG] == base.info.run_id and at in AT
        k = int(r.data.params["batch.ramp.1.tokens_per_update"]) // B
        steps = [s for s, _ in tracking.metric_history(uri, r.info.run_id, "train/loss")]
        assert steps == list(range(at, at + TOKENS, k * B)), (r.info.run_name, "from the branch point, each step once")
        if k == 1:  # the base's own continuation, restored through Ray Tune's checkpoint
            held = dict(tracking.metric_history(uri, base.info.run_id, "train/loss"))
            mine = tracking.metric_history(uri, r.info.run_id, "train/loss")
            assert [v for _, v in mine] == pytest.approx([held[s] for s, _ in mine], rel=1e-5)

    assert main(["report", str(path), f"tracking.uri={uri}", "--out", str(tmp_path / "report")]) == 0
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    points = report["branch_cbs"]
    assert [p["tokens"] for p in points] == AT
    for p in points:
        assert {"tokens", "cbs", "cbs_interval", "status", "b_simple"} <= set(p)
        assert p["status"] in ("resolved", "above", "below") and p["b_simple"] > 0
        assert p["batches"] == [B, 2 * B, 4 * B]
    assert "branch_fit" in report and (tmp_path / "report" / "branch_cbs.png").is_file()
    ramp = report["branch"]["ramp_override"]
    assert ramp.startswith("batch.ramp=[{from_tokens: 0, tokens_per_update: 256}")
    assert (
        main(["plan", str(ROOT / "conf" / "train" / "tiny.yaml"), "data.seq_len=64", "model.max_seq_len=64", ramp]) == 0
    )
