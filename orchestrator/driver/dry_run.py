"""`orchestrator sweep SWEEP --dry-run`: the trials a sweep would run, each with its batch split,
FLOPs, predicted memory per worker, wall time and device-hours, then the sweep's totals and ETA.

Nothing starts: no Ray, no MLflow (neither is imported), no corpus is read, no file is written,
and the GPU presence check is skipped. The trials are the sweep's own (studies/kinds.prepare, as
`sweep` plans them); `auto` micro-batches are the memory model's answer (micro_batch.from_model)
for --device-memory or the visible device. The arithmetic, and the assumptions it rests on, are
orchestrator/formulas/cost.py's.

The sweep's kind of study says its dry run (StudyKind.dry_run) in one of three layouts: every
trial listed (`listed`); a first round and the range up to a bound on trials (`bounded`, a
bracket search); or, for trials proposed while it runs (Optuna), the space and the range of cost
between the cheapest and the dearest corner of the keys that change cost (`ranged`).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from orchestrator.core import derived, sweep_schema
from orchestrator.core.errors import ConfigError
from orchestrator.core.schema import AUTO, Config
from orchestrator.driver import micro_batch, replay
from orchestrator.driver import plan as planning
from orchestrator.formulas import batching, cost, memory
from orchestrator.studies import kinds
from orchestrator.studies.search_space import Trial
from orchestrator.studies.study import Prepared, counted


@dataclass(frozen=True)
class Options:
    """What the command line says about the hardware (None: the defaults of cost.py)."""

    mfu: Optional[float] = None
    """--mfu: share of the peak a trial achieves."""
    peak_flops: Optional[float] = None
    """--peak-flops: FLOP/s of one GPU or CPU thread."""
    startup_s: Optional[float] = None
    """--startup-s: seconds of start-up per trial."""
    device_memory: Optional[float] = None
    """--device-memory in bytes: the device `auto` micro-batches are sized for."""
    list_all: bool = False
    """--all: a row for every trial and every infeasible one skipped, however many (else LISTED)."""


LISTED = 60
"""The most trials (and skipped ones) a dry run lists by name unless --all: the first ones, the last
few and a count between, so a space of thousands answers in a screen; the totals count them all."""


@dataclass(frozen=True)
class Row:
    """One trial of the table."""

    name: str
    """The trial's run name."""
    tokens_per_update: int
    """B."""
    lr: float
    """Peak learning rate."""
    micro_batch_size: int
    """b (for `auto`: the memory model's answer)."""
    auto: bool
    """b came from `batch.micro_batch_size: auto`."""
    capacity: Optional[float]
    """auto only: the device memory b was sized for."""
    grad_accum_steps: int
    """A."""
    num_workers: int
    """D."""
    steps: int
    """Optimizer steps in the rounded budget."""
    memory: Optional[float]
    """Predicted peak bytes per worker; None when the workload states no costs."""
    cost: cost.TrialCost
    """Tokens, FLOPs, wall time and device-hours."""
    rate: cost.Throughput
    """The throughput assumption the cost rests on."""
    held: float
    """GPUs (or CPUs) the trial holds while it runs."""
    against_fixed: Optional[Dict[str, Any]] = None
    """A batch schedule's steps and wall time against its first batch held fixed (plan.against_fixed);
    None for a fixed batch or a branch (it starts at its branch point)."""


def _check(options: Options) -> None:
    if options.mfu is not None and not 0 < options.mfu <= 1:
        raise ConfigError("--mfu", f"got {options.mfu:g}; must be in (0, 1], e.g. 0.4 for 40% of the peak")
    if options.peak_flops is not None and not (options.peak_flops > 0 and math.isfinite(options.peak_flops)):
        raise ConfigError(
            "--peak-flops", f"got {options.peak_flops:g}; must be > 0 FLOP/s, e.g. {cost.GPU_PEAK_FLOPS:g}"
        )
    if options.startup_s is not None and not (options.startup_s >= 0 and math.isfinite(options.startup_s)):
        raise ConfigError("--startup-s", f"got {options.startup_s:g}; must be >= 0 seconds")


def estimate(name: str, cfg: Config, options: Options, start: int = 0) -> Row:
    """One trial's row, training from `start` tokens (a branch's branch point) to its budget or
    train.stop_at_tokens; ConfigError when an `auto` micro-batch fits no sequence."""
    cfg = copy.deepcopy(cfg)
    auto = cfg.batch.micro_batch_size == AUTO
    capacity = None
    if auto:
        capacity = options.device_memory or planning.visible_device_memory(cfg)
        answer = micro_batch.from_model(cfg, capacity, micro_batch.per_worker_share(cfg))
        cfg.batch.micro_batch_size = micro_batch.fitting(cfg, answer["micro_batch_size"], capacity, "a worker")
    segments = derived.batch_segments(cfg)
    plan = batching.segment_at(segments, start).plan
    end = cfg.train.stop_at_tokens or segments[-1].end_tokens
    steps = batching.updates_until(segments, end) - batching.updates_until(segments, start)
    predicted = micro_batch.predict(cfg, plan.micro_batch_size)
    rate = cost.throughput(cfg.cluster.use_gpu, options.peak_flops, options.mfu, options.startup_s)
    devices, held = planning.trial_devices(cfg)
    flops_per_token = predicted[1].flops_per_token if predicted else None
    return Row(
        name=name,
        tokens_per_update=plan.tokens_per_update,
        lr=cfg.optim.lr,
        micro_batch_size=plan.micro_batch_size,
        auto=auto,
        capacity=capacity,
        grad_accum_steps=plan.grad_accum_steps,
        num_workers=plan.num_workers,
        steps=steps,
        memory=predicted[0].total if predicted else None,
        cost=cost.trial_cost(end - start, flops_per_token, devices, held, rate),
        rate=rate,
        held=held,
        against_fixed=None if start else planning.against_fixed(cfg, segments, flops_per_token, rate),
    )


def _estimate_all(prepared: Prepared, trials: Sequence[Trial], options: Options) -> Tuple[List[Row], List[str]]:
    rows, problems = [], []
    for t in trials:
        try:
            rows.append(estimate(t.name, t.cfg, options, prepared.study.start_of(t)))
        except ConfigError as exc:
            problems.append(f"[{t.name}] {exc}")
    if trials and not rows:  # as `sweep` would refuse: exit 2, not a table of nothing
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise ConfigError("space", f"no trial would start: {problems[0]}{more}")
    return rows, problems


# ---------------------------------------------------------------- rendering


def _flops(x: Optional[float]) -> str:
    return "unknown" if x is None else f"{x:.2e}".replace("e+", "e")


def _hours(x: Optional[float]) -> str:
    return "-" if x is None else (f"{x:,.1f}" if x >= 100 else f"{x:.3g}")


def _tflops(x: float) -> str:
    return f"{x / 1e12:,.0f} TFLOP/s" if x >= 1e12 else f"{x / 1e9:,.1f} GFLOP/s"


def assumption(rate: cost.Throughput, options: Options) -> List[str]:
    """The lines that say what the wall times rest on."""
    rest = (
        f"  start-up {rate.startup_s:g} s per trial; evaluations and checkpoints not counted; "
        f"change with --mfu, --peak-flops, --startup-s"
    )
    if rate.kind == "GPU":
        notes = [
            "--mfu" if options.mfu is not None else "",
            "--peak-flops" if options.peak_flops is not None else "H100/H200 bf16 dense",
            "" if options.mfu is not None else "measured 39.9% for gpt-350m on one H200 (benchmarks/gpu_throughput.py)",
        ]
        source = "; ".join(n for n in notes if n)
        return [f"assumed: MFU {rate.mfu:.0%} of {_tflops(rate.peak_flops)} per GPU ({source});", rest]
    mfu = f"MFU {rate.mfu:.0%} of " if rate.mfu != 1.0 or options.mfu is not None else ""
    if options.peak_flops is None:
        peak = (
            f"effective {_tflops(rate.peak_flops)} per CPU thread, measured with tiny.yaml "
            f"({cost.CPU_MEASURED_TOKENS_PER_S:,.0f} tokens/s on 1 CPU in docs/benchmarks.md x "
            f"{cost.CPU_MEASURED_FLOPS_PER_TOKEN / 1e6:.2f} MFLOP/token)"
        )
    else:
        peak = f"{_tflops(rate.peak_flops)} per CPU thread"
    return [f"assumed: {mfu}{peak}, one thread per whole CPU of a worker;", rest]


def table(rows: Sequence[Row]) -> List[str]:
    kinds = {r.cost.kind for r in rows}
    hours_head = f"{next(iter(kinds))}-h" if len(kinds) == 1 else "hours"
    width = min(44, max([5] + [len(r.name) for r in rows]))
    head = (
        f"{'trial':<{width}} {'tokens/update':>13} {'lr':>8} {'b':>5} {'A':>4} {'D':>4} {'steps':>8} "
        f"{'FLOPs':>8} {'mem/worker':>11} {'wall':>8} {hours_head:>8}"
    )
    lines = [head]
    for r in rows:
        b = f"{r.micro_batch_size}{'*' if r.auto else ''}"
        hours = _hours(r.cost.device_hours) + ("" if len(kinds) == 1 else f" {r.cost.kind}")
        lines.append(
            f"{r.name[:width]:<{width}} {r.tokens_per_update:>13,} {r.lr:>8.1e} {b:>5} {r.grad_accum_steps:>4} "
            f"{r.num_workers:>4} {r.steps:>8,} {_flops(r.cost.flops):>8} "
            f"{'-' if r.memory is None else memory.format_bytes(r.memory):>11} "
            f"{cost.format_duration(r.cost.wall_s):>8} {hours:>8}"
        )
    autos = sorted({r.capacity for r in rows if r.auto and r.capacity})
    if autos:
        lines.append(
            "* batch.micro_batch_size auto: the memory model's largest b for "
            + ", ".join(memory.format_bytes(c) for c in autos)
            + f" per worker, {memory.HEADROOM:.0%} left free (--device-memory; a GPU sweep probes the device)"
        )
    return lines


def _device_hours(hours: Dict[str, float]) -> str:
    return ", ".join(f"{_hours(v)} {k}-hours" for k, v in sorted(hours.items())) or "- device-hours"


def _at_once(rows: Sequence[Row], slots: int) -> str:
    """'; up to 32 GPUs at once': what the largest `slots` trials hold together."""
    kinds = {r.cost.kind for r in rows}
    if len(kinds) != 1:
        return ""
    held = sorted((r.held for r in rows), reverse=True)[:slots]
    return f"; up to {counted(sum(held), next(iter(kinds)))} at once"


def totals(sweep: sweep_schema.Sweep, rows: Sequence[Row]) -> Tuple[List[str], cost.SweepCost]:
    slots = sweep.search.max_concurrent
    total = cost.sweep_cost([r.cost for r in rows], slots)
    lines = [
        f"total: {counted(total.trials, 'trial')}, {_flops(total.flops)} FLOPs, {_device_hours(total.device_hours)}, "
        f"{cost.format_duration(total.wall_s)} of trial wall time (sum)"
    ]
    if total.eta_s is None:
        lines.append(f"ETA: unknown ({total.unknown} trials of a workload that states no costs)")
    else:
        lines.append(
            f"ETA: {cost.format_duration(total.eta_s)} ({total.eta_s:,.0f} s) with {counted(slots, 'trial')} at a time "
            f"(search.max_concurrent{_at_once(rows, slots)}), started in the order above as slots free up"
            + ("; ASHA stops some trials early, so the sweep may end sooner" if sweep.scheduler.type == "asha" else "")
        )
    return lines, total


def schedules(rows: Sequence[Row]) -> List[str]:
    """Per trial with a batch schedule (a ramp, or adaptive: a prediction), its steps and wall time
    against its first batch held fixed, as `plan` gives them."""
    return [
        f"[{r.name}] {what}: {text}"
        for r in rows
        if r.against_fixed
        for what, text in planning.against_fixed_rows(r.against_fixed)
    ]


def _distribution(spec: Dict[str, Any]) -> str:
    ((kind, args),) = spec.items()
    if kind in ("grid", "choice"):
        return f"{kind} {list(args)}"
    return f"{kind} [{args[0]:g}, {args[1]:g}]" + (" (inclusive)" if kind == "randint" else "")


def ranged(prepared: Prepared, options: Options, title: str, keys: List[str], trials: List[Trial], n: int) -> List[str]:
    """A study whose trials are proposed while it runs: its space, the cost of the corners of the
    keys that change cost (`trials`, feasible or not), then the range of cost over `n` trials."""
    sweep = prepared.sweep
    slots = sweep.search.max_concurrent
    width = max(len(k) for k in sweep.space) if sweep.space else 0
    lines = [title, "space:", *[f"  {k:<{width}}  {_distribution(s)}" for k, s in sweep.space.items()]]
    feasible = [t for t in trials if t.cfg is not None]
    rows, problems = _estimate_all(prepared, feasible, options)
    left_out = len(trials) - len(rows)
    lines.append(
        f"corners of the keys that change cost ({', '.join(keys) or 'none: every trial costs the same'}; "
        "the other keys at their first or middle value):"
        + (f" {left_out} of {len(trials)} infeasible or not fitting, left out" if left_out else "")
    )
    lines += [f"would not start: {p}" for p in problems]
    if not rows:
        return lines + ["cost range: unknown, no corner of the space is feasible"]
    for kind in sorted({r.cost.kind for r in rows}):
        lines += assumption(next(r.rate for r in rows if r.cost.kind == kind), options)
    lines += ["  " + line for line in table(rows)]
    span = cost.cost_range([r.cost for r in rows], n, slots)
    if span is None:
        return lines + ["cost range: unknown (a workload that states no costs)"]
    h = f"{span.kind}-hours"
    lines += [
        f"per trial: {_flops(span.trial_flops.low)} .. {_flops(span.trial_flops.high)} FLOPs, "
        f"{cost.format_duration(span.trial_wall_s.low)} .. {cost.format_duration(span.trial_wall_s.high)} wall, "
        f"{_hours(span.trial_device_hours.low)} .. {_hours(span.trial_device_hours.high)} {h}",
        f"total ({counted(n, 'trial')}): {_flops(span.flops.low)} .. {_flops(span.flops.high)} FLOPs, "
        f"{_hours(span.device_hours.low)} .. {_hours(span.device_hours.high)} {h}",
        f"ETA: {cost.format_duration(span.eta_s.low)} .. {cost.format_duration(span.eta_s.high)} "
        f"({span.eta_s.low:,.0f} .. {span.eta_s.high:,.0f} s) with {counted(slots, 'trial')} at a time "
        "(search.max_concurrent)"
        + ("; ASHA stops some trials early, so the sweep may end sooner" if sweep.scheduler.type == "asha" else ""),
    ]
    return lines


def listed(prepared: Prepared, options: Options, title: str) -> List[str]:
    """A study whose trials are all listed before it starts: each with its cost, then the totals."""
    sweep, trials, skipped = prepared.sweep, prepared.all_trials(), prepared.skipped  # a branch study's base first
    rows, problems = _estimate_all(prepared, trials, options)
    lines = [title]
    for kind in sorted({r.cost.kind for r in rows}):
        lines += assumption(next(r.rate for r in rows if r.cost.kind == kind), options)
    lines += table(rows) if options.list_all else shortened(table(rows), len(rows), "trials")
    lines += schedules(rows)
    refused = [f"skipped, infeasible (infeasible: skip): [{t.name}] {t.problem}" for t in skipped]
    lines += refused if options.list_all else shortened([""] + refused, len(refused), "skipped trials")[1:]
    lines += [f"would not start: {p}" for p in problems]
    lines += totals(sweep, rows)[0]
    return lines


def shortened(lines: List[str], count: int, what: str) -> List[str]:
    """A table's header line and at most LISTED of its `count` rows: the first ones, a line that
    counts the rest, the last five; what follows the rows (a footnote) is kept."""
    if count <= LISTED:
        return lines
    head, rows, tail = lines[0], lines[1 : 1 + count], lines[1 + count :]
    first = rows[: LISTED - 5]
    more = f"... {count - len(first) - 5:,} {what} more, counted in the totals below (--all lists every one)"
    return [head, *first, more, *rows[-5:], *tail]


def bounded(prepared: Prepared, options: Options, title: Callable[[int], str], repeats: int) -> List[str]:
    """A study that lists its first round and proposes up to `repeats` lrs per group (the trial's
    values but its lr) later: the first round with its cost, then the cost range up to that bound."""
    sweep, trials, skipped = prepared.sweep, prepared.trials, prepared.skipped
    slots = sweep.search.max_concurrent
    rows, problems, per_group = [], [], {}
    for t in trials:
        try:
            rows.append(estimate(t.name, t.cfg, options))
        except ConfigError as exc:
            problems.append(f"[{t.name}] {exc}")
            continue
        # (group, seed) -> one row: an lr changes no cost, so each of the group's lrs costs that
        per_group.setdefault(repr(sorted((k, v) for k, v in t.values.items() if k != "optim.lr")), rows[-1])
    bound = [r for r in per_group.values() for _ in range(repeats)]
    lines = [title(len(bound))]
    for kind in sorted({r.cost.kind for r in rows}):
        lines += assumption(next(r.rate for r in rows if r.cost.kind == kind), options)
    shown = table(rows) if options.list_all else shortened(table(rows), len(rows), "trials")  # as a grid's
    lines += ["first round (the later rounds' lrs depend on its results; an lr changes no cost):", *shown]
    lines += [f"skipped, infeasible (infeasible: skip): [{t.name}] {t.problem}" for t in skipped]
    lines += [f"would not start: {p}" for p in problems]
    lines += ["first round " + line for line in totals(sweep, rows)[0]]
    low, high = (
        cost.sweep_cost([r.cost for r in rows], slots),
        cost.sweep_cost([r.cost for r in bound], slots),
    )
    if low.eta_s is None or high.eta_s is None:
        return lines + ["cost range: unknown (a workload that states no costs)"]
    hours = sorted(set(low.device_hours) | set(high.device_hours))
    lines.append(
        f"cost range: {low.trials} .. {high.trials} trials, {_flops(low.flops)} .. {_flops(high.flops)} FLOPs, "
        + ", ".join(f"{_hours(low.device_hours.get(k))} .. {_hours(high.device_hours.get(k))} {k}-hours" for k in hours)
        + f"; ETA {cost.format_duration(low.eta_s)} .. {cost.format_duration(high.eta_s)} "
        f"({low.eta_s:,.0f} .. {high.eta_s:,.0f} s) with {counted(slots, 'trial')} at a time, "
        "more when a batch size's later rounds wait on each other"
    )
    return lines


@dataclass(frozen=True)
class Lines:
    """The layouts a kind of study says its dry run in (studies/study.DryRunLines), with the
    command's options."""

    options: Options

    def listed(self, prepared: Prepared, title: str) -> List[str]:
        return listed(prepared, self.options, title)

    def bounded(self, prepared: Prepared, title: Callable[[int], str], repeats: int) -> List[str]:
        return bounded(prepared, self.options, title, repeats)

    def ranged(self, prepared: Prepared, title: str, keys: List[str], corners: List[Trial], n: int) -> List[str]:
        return ranged(prepared, self.options, title, keys, corners, n)


def run(sweep_path: str, overrides: List[str], options: Options = Options()) -> int:
    """Print the dry run of a sweep; ConfigError (exit 2) for bad input."""
    _check(options)
    prepared = kinds.prepare(sweep_path, overrides)  # as `sweep` reads it
    print("\n".join(prepared.study.dry_run(prepared, Lines(options))))
    if prepared.sweep.replay is not None:
        print(
            f"replay: every trial is served from {replay.folder(prepared.sweep)} and trains nothing; "
            "the costs above are what training them would cost"
        )
    return 0
