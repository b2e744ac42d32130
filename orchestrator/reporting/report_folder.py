"""A report's folder as the input of another report: `report DIR` of a folder a report wrote reads
back, from its report.json, the settings that report was read with (the lr criterion, the primary
target, the target losses given, the loss tolerance, a branch study's tolerance, a ladder's
target), so the folder gives the same answer as the sweep it came from; the command line's flags
win. A folder without report.json (tables from another trainer) gets the defaults, and the printed
answer says which (`defaults_line`). Plain JSON, checked key by key: a report.json that is not one
a report wrote is one line, exit 2, naming the key.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Optional, Sequence, Tuple

from orchestrator.analysis import branch_cbs
from orchestrator.core.errors import ConfigError
from orchestrator.reporting.report_files import MARKER
from orchestrator.reporting.report_inputs import Settings, settings

CRITERIA = ("final_loss", "steps")


@dataclass(frozen=True)
class Recorded:
    """What a report folder asks of the analysis."""

    settings: Settings
    target_losses: Optional[Tuple[float, ...]]
    """The loss levels the earlier report was given (None: it chose them)."""
    ladder_target: Optional[Tuple[float, float]]
    """(N, D) the earlier report recommended for, when the folder holds a ladder."""


def read(
    folder: Path,
    lr_criterion: Optional[str] = None,
    loss_tolerance: Optional[float] = None,
    target_losses: Optional[Sequence[float]] = None,
) -> Recorded:
    """The settings of `folder`'s report.json, the command line's lr_criterion, loss_tolerance and
    target_losses over them; the defaults without one."""
    path = folder / MARKER
    defaults = settings(None, "default", lr_criterion, loss_tolerance)
    given = tuple(target_losses) if target_losses else None
    if not path.is_file():
        return Recorded(defaults, given, None)
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ConfigError(
            str(path), f"not a report's report.json ({exc.__class__.__name__}); remove it or give another folder"
        ) from None
    if not isinstance(data, dict):
        raise ConfigError(str(path), "not a report's report.json (not a JSON object)")
    recorded = (data.get("source") or {}).get("settings") or {}
    where = f"the report {path}"

    def origin(key: str) -> str:
        earlier = recorded.get(key) if isinstance(recorded, dict) else None
        return f"{where} ({earlier})" if isinstance(earlier, str) and earlier != "default" else where

    options, origins = dict(defaults.options), dict(defaults.origin)
    if lr_criterion is None and "lr_criterion" in data:
        options["lr_criterion"] = _word(path, "lr_criterion", data["lr_criterion"], CRITERIA)
        origins["lr_criterion"] = origin("lr_criterion")
    if data.get("primary_target") is not None:
        options["primary_target"] = _positive(path, "primary_target", data["primary_target"])
        origins["primary_target"] = origin("primary_target")
    tolerance = _recorded_tolerance(path, data)
    if loss_tolerance is None and tolerance is not None:
        options["loss_tolerance"], origins["loss_tolerance"] = tolerance, origin("loss_tolerance")
    branch = data.get("branch")
    if isinstance(branch, dict) and "tolerance" in branch:
        try:
            options["branch_tolerance"] = branch_cbs.Tolerance(
                _positive(path, "branch.tolerance", branch["tolerance"]),
                str(branch.get("tolerance_kind", branch_cbs.RELATIVE)),
                str(branch.get("compare", branch_cbs.REFERENCE)),
            )
        except ValueError as exc:
            raise ConfigError(f"{path}: branch", str(exc)) from None
        origins["branch_tolerance"] = origin("branch_tolerance")
    targets = given
    if targets:
        origins["target_losses"] = "command line"
    elif data.get("targets_chosen") is False:  # the earlier report was given its loss levels
        targets = tuple(_positive(path, "critical_batch.target_loss", f.get("target_loss")) for f in _list(path, data))
        origins["target_losses"] = origin("target_losses")
    return Recorded(Settings(options, origins), targets, _ladder_target(path, data))


def defaults_line(origin: Dict[str, str], options: Dict[str, Any]) -> Optional[str]:
    """The printed line that names the settings a report fell back on, when any did."""
    shown = {
        "lr_criterion": lambda: f"lr criterion {options.get('lr_criterion')}",
        "primary_target": lambda: "primary target the lowest resolved loss",
        "loss_tolerance": lambda: f"loss tolerance {options.get('loss_tolerance', 0):.2%}",
    }
    used = [show() for key, show in shown.items() if origin.get(key) == "default"]
    if not used:
        return None
    return "Settings by default (nothing recorded them): " + ", ".join(used) + "."


def _recorded_tolerance(path: Path, data: Dict[str, Any]) -> Optional[float]:
    for section in ("ladder", "recommendation"):
        holder = data.get(section)
        if isinstance(holder, dict) and holder.get("tolerance") is not None:
            value = _positive(path, f"{section}.tolerance", holder["tolerance"])
            if value >= 1:
                raise ConfigError(f"{path}: {section}.tolerance", f"{value!r}: a share of the loss between 0 and 1")
            return value
    return None


def _ladder_target(path: Path, data: Dict[str, Any]) -> Optional[Tuple[float, float]]:
    rec = (data.get("ladder") or {}).get("recommendation") if isinstance(data.get("ladder"), dict) else None
    if not isinstance(rec, dict) or rec.get("tokens") is None:
        return None
    return _positive(path, "ladder.recommendation.params", rec.get("params")), _positive(
        path, "ladder.recommendation.tokens", rec.get("tokens")
    )


def _list(path: Path, data: Dict[str, Any]) -> Sequence[Dict[str, Any]]:
    fits = data.get("critical_batch")
    if not isinstance(fits, list) or not fits or not all(isinstance(f, dict) for f in fits):
        raise ConfigError(f"{path}: critical_batch", "a list of targets, each {target_loss, ...}")
    return fits


def _positive(path: Path, key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (math.isfinite(value) and value > 0):
        raise ConfigError(f"{path}: {key}", f"{value!r}: a finite number > 0")
    return float(value)


def _word(path: Path, key: str, value: Any, words: Sequence[str]) -> str:
    if value not in words:
        raise ConfigError(f"{path}: {key}", f"{value!r}: one of {', '.join(words)}")
    return value
