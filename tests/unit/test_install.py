"""The install (Makefile, deploy/uv_pip.py, requirements.lock): uv installs from the index pip is
set to, and every file of the pinned set is checked against its hash."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from deploy import uv_pip

ROOT = Path(__file__).resolve().parents[2]


def pinned(text: str) -> dict:
    """{normalised name: version} of a requirements file's `name==version` lines."""
    found = re.findall(r"^([A-Za-z0-9_.-]+)==([^\s;\\]+)", text, flags=re.M)
    return {re.sub(r"[-_.]+", "-", name).lower(): version for name, version in found}


def test_uv_gets_the_index_pip_is_set_to(tmp_path):
    """A mirror in a user's pip.conf, extra indexes and find-links in [install], an index in a
    PIP_* variable over the file's: what `pip config list` reads reaches uv, in pip's precedence."""
    config = tmp_path / ".config" / "pip" / "pip.conf"
    config.parent.mkdir(parents=True)
    config.write_text(
        "[global]\nindex-url = https://mirror.example/simple\nextra-index-url = https://a.example/simple\n"
        "[install]\nextra-index-url = https://b.example/simple https://c.example/simple\nfind-links = /srv/wheels\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.update(HOME=str(tmp_path), XDG_CONFIG_HOME=str(tmp_path / ".config"), XDG_CONFIG_DIRS=str(tmp_path / "xdg"))

    def read(**extra):
        listing = subprocess.run(
            [sys.executable, "-m", "pip", "config", "list"], env={**env, **extra}, capture_output=True, text=True
        ).stdout
        return uv_pip.for_uv(uv_pip.pip_settings(listing))

    variables, options = read()
    assert variables == {
        "UV_INDEX_URL": "https://mirror.example/simple",
        "UV_EXTRA_INDEX_URL": "https://b.example/simple https://c.example/simple",  # [install] over [global]
        "UV_INDEX_STRATEGY": "unsafe-best-match",  # pip's: the best version across every index
    }
    assert options == ["--find-links", "/srv/wheels"]
    variables, _ = read(PIP_INDEX_URL="https://u:secret@env.example/simple")
    assert variables["UV_INDEX_URL"] == "https://u:secret@env.example/simple"  # a variable over the file
    config.write_text("[global]\ntimeout = 60\n")
    assert read() == ({}, [])  # no index named: uv's own default, as before


def test_the_password_of_an_index_reaches_uv_in_its_environment_not_its_arguments(tmp_path, monkeypatch):
    """uv_pip runs uv with the index in UV_INDEX_URL: a password in it shows in no process list."""
    fake_uv = tmp_path / "bin" / "uv"
    fake_uv.parent.mkdir()
    fake_uv.write_text(
        '#!/bin/sh\necho "$UV_INDEX_URL" > "$(dirname "$0")/seen"\necho "$@" >> "$(dirname "$0")/seen"\n'
    )
    fake_uv.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(tmp_path / "bin" / "python"))
    listing = ":env:.index-url='https://u:secret@mirror.example/simple'\n"
    monkeypatch.setattr(
        uv_pip.subprocess, "run", _runs_for_real_but_pip_config(listing, uv_pip.subprocess.run), raising=True
    )
    assert uv_pip.main(["install", "-q", "-r", "requirements.lock"]) == 0
    url, args = (tmp_path / "bin" / "seen").read_text().splitlines()
    assert url == "https://u:secret@mirror.example/simple" and "secret" not in args
    assert args == "pip install -q -r requirements.lock"


def _runs_for_real_but_pip_config(listing, run):
    def fake(command, **kwargs):
        if command[1:] == ["-m", "pip", "config", "list"]:
            return subprocess.CompletedProcess(command, 0, listing, "")
        return run(command, **kwargs)

    return fake


def test_the_lock_is_the_pinned_set_with_a_hash_for_every_file():
    """requirements.lock pins what constraints.txt pins (torch and its CUDA stack left to the
    torch step, uv to pip), each requirement with its hashes; the Makefile installs from it,
    checking them."""
    lock = (ROOT / "requirements.lock").read_text()
    constraints = pinned((ROOT / "constraints.txt").read_text())
    locked = pinned(lock)
    stack = re.search(r"^TORCH_STACK := (.*?)(?<!\\)\n", (ROOT / "Makefile").read_text(), flags=re.M | re.S)
    left_out = set(stack.group(1).replace("\\\n", " ").split()) | {"uv"}
    assert {k: v for k, v in constraints.items() if k not in left_out} == {
        k: v for k, v in locked.items() if k in constraints
    }
    assert not left_out & set(locked)
    for requirement in re.split(r"\n(?=[A-Za-z0-9])", lock.split("\n", 2)[2].strip()):
        assert "--hash=sha256:" in requirement, requirement.splitlines()[0]
    makefile = (ROOT / "Makefile").read_text()
    assert "--require-hashes --no-deps -r requirements.lock" in makefile
    assert "deploy/uv_pip.py install" in makefile
