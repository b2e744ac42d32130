"""`uv pip ARGS` with pip's index settings: `make setup` installs with uv, which reads neither
pip.conf nor the PIP_* variables, so where pip is set to a mirror uv would install from the public
index. This reads them as pip does (`pip config list`: PIP_* variables over pip install's section
over [global]) and hands them to uv: the index URLs in uv's variables (a URL may hold a password,
which then shows in no process's arguments), find-links and no-index as options, and pip's
strategy of the best version across every index. Standard library only: it runs before the
project is installed.

    python deploy/uv_pip.py install -r requirements.lock ...
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Tuple

KEYS = ("index-url", "extra-index-url", "find-links", "no-index")
PRECEDENCE = {":env:": 2, "install": 1}
"""A section's rank in pip's order: the PIP_* variables, then `pip install`'s section, then [global]."""


def pip_settings(listing: str) -> Dict[str, str]:
    """The index settings of `pip config list`'s output, each from the section pip would use."""
    found: Dict[str, Tuple[int, str]] = {}
    for line in listing.splitlines():
        name, _, value = line.partition("=")
        section, _, key = name.rpartition(".")
        rank = PRECEDENCE.get(section, 0)
        if key in KEYS and (key not in found or rank >= found[key][0]):
            found[key] = (rank, value.strip().strip("'\""))
    return {key: value for key, (_, value) in found.items()}


def for_uv(settings: Dict[str, str]) -> Tuple[Dict[str, str], List[str]]:
    """(uv's variables, uv's options) for pip's settings; nothing when pip names no index."""
    env: Dict[str, str] = {}
    options: List[str] = []
    if settings.get("index-url"):
        env["UV_INDEX_URL"] = settings["index-url"]
    if settings.get("extra-index-url"):
        env["UV_EXTRA_INDEX_URL"] = " ".join(settings["extra-index-url"].split())
    for link in settings.get("find-links", "").split():
        options += ["--find-links", link]
    if settings.get("no-index", "").lower() in ("1", "true", "yes", "on"):
        options.append("--no-index")
    if env or options:  # pip takes the best version across every index; uv's default, the first index's
        env["UV_INDEX_STRATEGY"] = "unsafe-best-match"
    return env, options


def main(args: List[str]) -> int:
    listing = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, check=True
    ).stdout
    env, options = for_uv(pip_settings(listing))
    uv = Path(sys.executable).parent / "uv"
    command = [str(uv), "pip", *args[:1], *options, *args[1:]]
    return subprocess.run(command, env={**os.environ, **env}).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
