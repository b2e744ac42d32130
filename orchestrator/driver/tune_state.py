"""Tune's state files in a sweep's phase folder, mended before `sweep --resume` hands them to
Tune. Tune writes each one whole into the driver's staging folder (in Ray's session folder) and
then copies it to the sweep's folder; a driver killed during that copy leaves the sweep's copy cut
short, and Tune, failing to read it, starts the sweep over ("Failed to restore the run state").
The killed driver's staging copy is still on this machine, whole: a file of the sweep's folder
that is a strict beginning of its staging copy is replaced by it.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import List, Optional


def staging_copies(temp_root: Path, phase: str, name: str) -> List[Path]:
    """The copies of Tune's state file `name` in the staging folders of every Ray session under
    `temp_root` (Ray's temp folder): `session_*/artifacts/<started>/<phase>/driver_artifacts/<name>`."""
    return sorted(temp_root.glob(f"session_*/artifacts/*/{phase}/driver_artifacts/{name}"))


def cut_short(path: Path, whole: Path) -> bool:
    """`path` holds fewer bytes than `whole` and all of them are its beginning: a copy cut short."""
    size = path.stat().st_size
    if size >= whole.stat().st_size:
        return False
    with path.open("rb") as mine, whole.open("rb") as theirs:
        return mine.read() == theirs.read(size)


def mend(folder: Path, temp_root: Optional[Path]) -> List[str]:
    """Replace every state file of Tune's phase `folder` that was cut short by its whole staging
    copy; the names of those replaced. Nothing is replaced without a whole copy to replace it by."""
    if temp_root is None or not folder.is_dir():
        return []
    mended = []
    for path in sorted(p for p in folder.iterdir() if p.is_file()):
        copies = [c for c in staging_copies(temp_root, folder.name, path.name) if cut_short(path, c)]
        if copies:  # an empty file begins every copy: the newest is the one it was cut from
            whole = max(copies, key=lambda c: c.stat().st_mtime)
            shutil.copyfile(whole, path)
            mended.append(path.name)
    return mended


def ray_temp_root() -> Optional[Path]:
    """Ray's temp folder (the parent of its session folders) of the Ray this driver runs on."""
    import ray

    if not ray.is_initialized():
        return None
    from ray.train.constants import _get_ray_train_session_dir

    return Path(_get_ray_train_session_dir()).parent.parent
