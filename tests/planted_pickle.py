"""A checkpoint file with a planted pickle: an object whose unpickling creates a marker file, the
shape of an attack by whoever can write a run's storage (tests of "nothing untrusted is unpickled")."""

from __future__ import annotations

from pathlib import Path

import torch

from workloads.train import checkpoint


class Planted:
    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):  # unpickling calls open(marker, "w"): the file appears
        return (open, (self.marker, "w"))


def plant(path: Path, marker: Path, legacy: bool = False) -> None:
    """Add a Planted object to the dict pickled at `path`, saved again in the zip or the legacy format."""
    with checkpoint.weights_only_loads():
        contents = torch.load(path, map_location="cpu", weights_only=True)
    contents["planted"] = Planted(marker)
    torch.save(contents, path, _use_new_zipfile_serialization=not legacy)
