"""Where a run's fixed cost goes: seconds between named marks, logged to MLflow as
`startup/<phase>_s` (trial start to the first update) and `teardown/<phase>_s` (last update to
the run's end); docs/mlflow.md lists them. Marks are wall-clock (`time.time`) so that the
trial's process and its workers, on one node, add up to one timeline."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Dict, Optional


@dataclass
class Phases:
    prefix: str  # "startup" or "teardown"
    since: float = field(default_factory=time.time)  # the end of the last phase
    seconds: Dict[str, float] = field(default_factory=dict)  # metric name -> seconds

    def mark(self, name: str) -> None:
        """The phase `name` ended now: it took the time since the last mark."""
        now = time.time()
        self.seconds[f"{self.prefix}/{name}_s"] = max(0.0, now - self.since)
        self.since = now

    def total(self) -> float:
        return sum(self.seconds.values())

    def as_payload(self) -> Dict[str, object]:
        """What travels to a worker, which carries on from here."""
        return {"prefix": self.prefix, "since": self.since, "seconds": dict(self.seconds)}

    @classmethod
    def from_payload(cls, payload: Optional[Dict[str, object]], prefix: str = "startup") -> "Phases":
        if not payload:
            return cls(prefix)
        return cls(str(payload["prefix"]), float(payload["since"]), dict(payload["seconds"]))
