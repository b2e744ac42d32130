"""A sweep's Tune state cut short by a killed driver is mended from the driver's staging copy
(orchestrator/driver/tune_state.py) before `sweep --resume` hands it to Tune; a whole file, a
file that differs from the copy (not cut from it) and a file with no copy are left as they are."""

from __future__ import annotations

import os

from orchestrator.driver import tune_state

STATE = b"\x80\x05\x95" + bytes(range(256)) * 8 + b"."  # a pickle's bytes, ending in its STOP opcode


def staging(root, session, name, data, started="2026-12-06_12-00-00", phase="tune"):
    path = root / f"session_{session}" / "artifacts" / started / phase / "driver_artifacts" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def test_a_state_file_cut_short_is_replaced_by_the_killed_drivers_whole_copy(tmp_path):
    root, phase = tmp_path / "ray", tmp_path / "sweep" / "tune"
    phase.mkdir(parents=True)
    files = {
        "basic-variant-state-x.json": STATE[:1000],  # cut short during the copy
        "experiment_state-x.json": b"",  # cut before its first byte
        "tuner.pkl": STATE,  # whole
        "searcher-state-x.pkl": b"another run's" + STATE[:100],  # not a beginning of the copy
        "lonely.json": STATE[:10],  # no copy anywhere
    }
    for name, data in files.items():
        (phase / name).write_bytes(data)
    for name in files:
        if name != "lonely.json":
            staging(root, "1", name, STATE)
    older = staging(root, "0", "experiment_state-x.json", b"an earlier session's copy")
    os.utime(older, (1, 1))  # the empty file begins both: the newest copy is the one it was cut from
    assert tune_state.mend(phase, root) == ["basic-variant-state-x.json", "experiment_state-x.json"]
    assert (phase / "basic-variant-state-x.json").read_bytes() == STATE
    assert (phase / "experiment_state-x.json").read_bytes() == STATE
    for name in ("tuner.pkl", "searcher-state-x.pkl", "lonely.json"):
        assert (phase / name).read_bytes() == files[name]
    assert tune_state.mend(phase, root) == []  # nothing left to mend
    assert tune_state.mend(phase, None) == [] and tune_state.mend(tmp_path / "none", root) == []
