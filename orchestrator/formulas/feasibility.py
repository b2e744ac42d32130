"""Does a trial's shape fit the cluster? Checked before anything waits on Ray's placement.

Ray Train V2 retries a placement group that can never be placed forever, so a trial that
asks for more than any arrangement of the cluster's nodes offers would hang silently. The
arithmetic here is pure: a shape (D identical worker bundles in a placement strategy, plus
the Tune trial's own resources) against the nodes' total resources.

Assumptions: bundles are identical (one per Ray Train worker); PACK and SPREAD are soft, so
any assignment of bundles to nodes will do; STRICT_PACK puts every bundle on one node and
STRICT_SPREAD each on its own node. The trial's resources are held by a separate actor, on
any node, beside the bundles.

Plain numbers only: what a config implies for its shape (its workers, their CPUs and GPUs, the
strategy) is read in the core (orchestrator/core/derived.py: worker_resources, shape_of).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Dict, List, Mapping, Optional, Sequence

STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")
_EPS = 1e-9

Resources = Mapping[str, float]


@dataclass(frozen=True)
class Shape:
    """What one trial (or one `train` run) holds while it runs."""

    workers: int
    """D: Ray Train workers, one bundle each."""
    per_worker: Dict[str, float]
    """Resources of one bundle, e.g. {"CPU": 8, "GPU": 1}."""
    strategy: str = "PACK"
    """Ray placement strategy of the bundles (STRATEGIES)."""
    trial: Dict[str, float] = field(default_factory=dict)
    """The Tune trial's own resources, held apart from the bundles ({} for `train`)."""

    def describe(self) -> str:
        text = f"{self.workers} x {_fmt(self.per_worker)} ({self.strategy})"
        return text + (f" + {_fmt(self.trial)} for the trial" if any(self.trial.values()) else "")


def _fmt(resources: Resources) -> str:
    return "{" + ", ".join(f"{k}: {v:g}" for k, v in sorted(resources.items()) if v) + "}"


def _copies(node: Resources, bundle: Resources) -> int:
    """How many bundles fit on one node (a bundle asking for nothing counts as fitting often)."""
    counts = [int((node.get(k, 0.0) + _EPS) // v) for k, v in bundle.items() if v > 0]
    return min(counts) if counts else 1 << 30


def _minus(node: Resources, used: Resources) -> Optional[Dict[str, float]]:
    """What is left of `node` after `used`, None when it does not fit."""
    left = {k: node.get(k, 0.0) - v for k, v in used.items() if v > 0}
    if any(v < -_EPS for v in left.values()):
        return None
    return {**node, **left}


def _bundles_fit(shape: Shape, nodes: Sequence[Resources]) -> bool:
    copies = [_copies(n, shape.per_worker) for n in nodes]
    if shape.strategy == "STRICT_PACK":
        return any(c >= shape.workers for c in copies)
    if shape.strategy == "STRICT_SPREAD":
        return sum(c >= 1 for c in copies) >= shape.workers
    return sum(copies) >= shape.workers


def fits(shape: Shape, nodes: Sequence[Resources]) -> bool:
    """Can the trial's actor and its D bundles be placed on `nodes` (their total resources)?"""
    if not any(shape.trial.values()):
        return _bundles_fit(shape, nodes)
    for i, node in enumerate(nodes):  # the trial's actor on node i, the bundles around it
        left = _minus(node, shape.trial)
        if left is not None and _bundles_fit(shape, [*nodes[:i], left, *nodes[i + 1 :]]):
            return True
    return False


def nearest(shape: Shape, nodes: Sequence[Resources]) -> List[str]:
    """Overrides that would fit, changing one thing: fewer CPUs per worker, or fewer workers."""
    out = []
    hundredths = int(shape.per_worker.get("CPU", 0.0) * 100 + _EPS)

    def with_cpus(h: int) -> Shape:
        return replace(shape, per_worker={**shape.per_worker, "CPU": h / 100})

    lo, hi = 0, hundredths  # fits() is monotone in the CPUs per worker: bisect on hundredths
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(with_cpus(mid), nodes) else (lo, mid - 1)
    if lo > 0:
        out.append(f"cluster.cpus_per_worker={lo / 100:g}")
    fewer = next((d for d in range(shape.workers - 1, 0, -1) if fits(replace(shape, workers=d), nodes)), None)
    if fewer:
        out.append(f"cluster.num_workers={fewer}")
    return out


def distinct(shapes: Sequence[Shape]) -> List[Shape]:
    """Each shape once, in order (the trials of a sweep mostly share a few)."""
    return list({s.describe(): s for s in shapes}.values())


def problem(shape: Shape, nodes: Sequence[Resources], where: str) -> Optional[str]:
    """None when the shape fits; else one line naming the shape, the cluster and what would fit."""
    if fits(shape, nodes):
        return None
    asked = {k for k, v in (*shape.per_worker.items(), *shape.trial.items()) if v}
    cluster = ", ".join(_fmt({k: v for k, v in n.items() if k in asked}) for n in nodes) or "no nodes"
    hint = nearest(shape, nodes)
    return (
        f"a trial needs {shape.describe()}, which {where} ({len(nodes)} node(s): {cluster}) can never place, "
        f"so it would wait forever; "
        + (f"nearest that fits: {' or '.join(hint)}" if hint else "no smaller shape fits either: add nodes or GPUs")
    )


def node_groups(alive: Sequence[Resources], groups: Sequence[tuple]) -> List[Dict[str, float]]:
    """The nodes a cluster has or can autoscale to: the alive nodes, plus for each autoscaling
    group (resources, max_count) the nodes it may still add. Alive nodes with a group's exact
    resources count as that group's; max_count -1 (unbounded) adds enough for any trial."""
    nodes = [dict(n) for n in alive]
    for resources, max_count in groups:
        same = sum(1 for n in alive if _same(n, resources))
        extra = 64 if max_count < 0 else max(0, max_count - same)
        nodes += [dict(resources) for _ in range(extra)]
    return nodes


def _same(a: Resources, b: Resources) -> bool:
    keys = {k for k in (*a, *b) if k in ("CPU", "GPU")}
    return all(abs(a.get(k, 0.0) - b.get(k, 0.0)) < _EPS for k in keys)


def bundle(cpus: float, gpus: float = 0.0) -> Dict[str, float]:
    """One worker's bundle, what Ray reserves for it: e.g. {"CPU": 8, "GPU": 1}; no GPU key
    when gpus is 0 (a CPU run)."""
    return {"CPU": cpus, **({"GPU": gpus} if gpus else {})}
