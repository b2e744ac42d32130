"""Unit tests start nothing. A test process that ran integration files first (make test hands
them out first) still holds their local Ray (tests/conftest.py::ray_session), whose processes
take CPU while idle; it is left before the first unit file, so it idles beside none of them."""

import sys

import pytest


@pytest.fixture(autouse=True, scope="module")
def no_idle_ray():
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()
    yield
