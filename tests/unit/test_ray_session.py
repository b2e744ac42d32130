"""Leaving Ray while the sweep's closing report is written."""

import gc
import threading

import ray

from orchestrator.driver import ray_session


def test_the_cyclic_collector_waits_while_ray_shuts_down_and_resumes_after(monkeypatch):
    """A Ray object that the collector frees while the driver disconnects aborts the process (CI
    saw it after a resumed sweep): the collector is off for as long as ray.shutdown runs, and on
    again once Ray is left."""
    inside, release = threading.Event(), threading.Event()
    seen = {}

    def shutdown():
        seen["collecting"] = gc.isenabled()
        inside.set()
        release.wait(10)

    monkeypatch.setattr(ray, "shutdown", shutdown)
    assert gc.isenabled()
    thread = ray_session.shut_down_meanwhile()
    assert inside.wait(10)
    assert not gc.isenabled()  # the caller's thread, during the shutdown
    release.set()
    thread.join(10)
    assert seen["collecting"] is False and gc.isenabled()


def test_a_collector_the_caller_had_switched_off_stays_off(monkeypatch):
    monkeypatch.setattr(ray, "shutdown", lambda: None)
    gc.disable()
    try:
        ray_session.shut_down_meanwhile().join(10)
        assert not gc.isenabled()
    finally:
        gc.enable()
