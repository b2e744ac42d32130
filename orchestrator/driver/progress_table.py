"""The live table of a running sweep (a Ray Tune callback): each trial's progress (every trial's up
to ALL_ROWS_UP_TO, then the running, best and failed ones and a count of the rest), the sweep's
counts and ETA, the best finished trial so far."""

from __future__ import annotations

import math
import sys
import time
from collections import Counter
from typing import Any, Callable, Dict, List, Optional, Tuple

from ray import tune

from orchestrator.core import derived, sweep_schema
from orchestrator.core.schema import Config
from orchestrator.formulas import cost
from orchestrator.reporting.report_format import TOK, cell
from orchestrator.studies import kinds, search_space
from orchestrator.studies.study import StudyKind

QUIET_UP_TO_S = 60.0
"""In a log (not a terminal) a line is printed when a trial starts or ends; past this long
without one, a line of the sweep's counts and ETA."""
ENDED = ("DONE", "STOPPED", "ERROR")
ALL_ROWS_UP_TO = 30
"""Up to this many trials the table lists every one. Past it, the running trials, the best finished
ones and the failed ones, and a count of the rest: a sweep of hundreds stays readable, and a
refresh costs about the same at any size."""
BEST_LISTED = 5
"""Finished trials (lowest eval loss first), and failed ones (latest), listed past ALL_ROWS_UP_TO."""
COLUMNS = [  # (header, width, right-aligned); the trial column is as wide as the longest name
    ("trial", 0, False),
    ("tokens/update", 13, True),
    ("lr", 9, True),
    ("warmup", 9, True),
    ("tokens done", 13, True),
    ("done", 5, True),
    ("ETA", 8, True),
    ("loss", 7, True),
    ("eval", 7, True),
    ("status", 0, False),
]
_LIVE: List[Any] = []
"""rich Live displays still on screen (finish() stops any the Tune callbacks did not)."""


def _fmt(value: Any, spec: str) -> str:
    return "-" if value is None or (isinstance(value, float) and not math.isfinite(value)) else format(value, spec)


def stop_live() -> None:
    """Stop every live table still refreshing (idempotent)."""
    while _LIVE:
        _LIVE.pop().stop()


class ProgressTable(tune.Callback):
    """Every trial Tune knows, pending ones included (past ALL_ROWS_UP_TO: the running, best and
    failed ones, the rest counted): tokens/update, lr, warmup, tokens done and their share of the
    trial's budget, ETA, loss, eval, status; above them the sweep's counts and ETA, below them the
    best finished trial so far.

    Counts. A grid's or Optuna's trials are known in advance: ended/total, running, pending (the
    rest). The bracket search proposes its trials as results come and stops a batch size's search
    once its lr is bracketed, so its total is an upper bound: pending counts the trials Tune has
    created and not started, and the total reads "of up to N".

    ETAs. A trial's rate is its tokens since its first result (after a restart, since the first
    result of the restart) over the time since then; its ETA is its remaining tokens at that rate.
    The sweep's ETA is the pace of the trials done so far in wall time (cost.sweep_eta_s), from the
    first trial's end on: start-ups and early stopping are in it, which a token rate taken from the
    first results leaves out. Under the bracket search it is an upper bound ("at most").

    On a terminal the table refreshes in place (rich) whenever a result arrives. In a log (CI, a
    file) a line is printed when a trial starts or ends, the sweep's counts and ETA when nothing
    else was printed for QUIET_UP_TO_S, and the whole table when the sweep ends. `clock` and
    `console` (a rich Console: live display on it) are for tests."""

    def __init__(
        self,
        sweep: sweep_schema.Sweep,
        clock: Callable[[], float] = time.monotonic,
        console: Any = None,
        study: Optional[StudyKind] = None,
        base: Optional[Config] = None,
    ) -> None:
        self.sweep = sweep
        self.study = study or kinds.kind_of(sweep)
        self.rows: Dict[str, Dict[str, Any]] = {}
        self.expected = 0
        self.bound_only = self.study.bounded  # expected is then an upper bound
        self.clock = clock
        self.console = console
        self.last_print = -math.inf
        self.started_at: Optional[float] = None  # the first trial's start
        self._live: Any = None
        self._base = base  # search_space.unvalidated_base(sweep), read at the first row if not given

    def __getstate__(self) -> Dict[str, Any]:  # Tune may pickle its callbacks; a Live display cannot be
        return {**self.__dict__, "_live": None}

    def setup(self, stop=None, num_samples=None, total_num_samples=None, **info):
        self.expected = total_num_samples or 0

    def _row(self, trial) -> Dict[str, Any]:
        if trial.trial_id not in self.rows:
            self._base = self._base or search_space.unvalidated_base(self.sweep)
            resolved = self.study.resolve(self.sweep, trial.config["trial"], self._base)
            c = resolved.cfg
            self.rows[trial.trial_id] = {
                "name": resolved.name,
                # a branch: its batch after the branch point, and the tokens where it stops
                "B": (c.batch.ramp[-1].tokens_per_update if c.batch.ramp else c.batch.tokens_per_update) if c else None,
                "lr": c.optim.lr if c else None,
                "warmup": c.schedule.warmup_tokens if c else None,
                "budget": (c.train.stop_at_tokens or derived.rounded_budget(c)) if c else None,
                "tokens": 0,
                "loss": None,
                "eval": None,
                "status": "PENDING",
                "started": None,  # when the trial (re)started
                "wall": None,  # seconds from its (last) start to its end
                "first": None,  # (tokens, time) of the first result since the trial (re)started
                "rate": None,
                "holds": derived.trial_resources(c, self.sweep.local_mode),  # what Tune reserves for it
            }
        return self.rows[trial.trial_id]

    def _know(self, trials) -> None:
        """A row for every trial Tune has created, PENDING until it starts."""
        for t in trials:
            self._row(t)

    def on_trial_start(self, iteration, trials, trial, **info):
        self._know(trials)
        if self.started_at is None:
            self.started_at = self.clock()
        row = self._row(trial)
        row.update(status="RUNNING", started=self.clock(), first=None, rate=None)
        self._changed(f"started {row['name']}")

    def on_trial_result(self, iteration, trials, trial, result, **info):
        self._know(trials)
        row = self._row(trial)
        now = self.clock()
        tokens = result.get("tokens", row["tokens"])
        if self.started_at is None:  # a resumed sweep's first result
            self.started_at = now
        if row["started"] is None:
            row["started"] = now
        row.update(
            tokens=tokens,
            loss=result.get("loss"),
            eval=result.get("eval_loss"),
            status="RUNNING",
        )
        if row["first"] is None:
            row["first"] = (row["tokens"], now)
        else:
            row["rate"] = cost.rate(*row["first"], row["tokens"], now) or row["rate"]
        if self._is_live():
            self._show_live()
        elif now - self.last_print > QUIET_UP_TO_S:
            self._line(self.title())

    def on_trial_complete(self, iteration, trials, trial, **info):
        row = self._row(trial)
        row["status"] = "STOPPED" if row["budget"] and row["tokens"] < row["budget"] * 0.99 else "DONE"
        row["wall"] = self._wall(row)
        scores = ", ".join(f"{k} {row[k]:.3f}" for k in ("loss", "eval") if row[k] is not None)
        scores = f" ({scores})" if scores else ""
        self._changed(f"{row['status'].lower()} {row['name']}{scores}; {self.title()}")

    def on_trial_error(self, iteration, trials, trial, **info):
        row = self._row(trial)
        row["status"] = "ERROR"
        row["wall"] = self._wall(row)
        self._changed(f"failed {row['name']} at {row['tokens']:,} tokens; {self.title()}")

    def on_experiment_end(self, trials, **info):
        self.expected, self.bound_only = len(self.rows), False  # the count is known now
        if not self._is_live():
            self.print()
        self.stop()

    # ------------------------------------------------------------ the figures

    def _wall(self, row: Dict[str, Any]) -> float:
        return self.clock() - row["started"] if row["started"] is not None else 0.0

    def trial_eta_s(self, row: Dict[str, Any]) -> Optional[float]:
        """Seconds until a running trial reaches its budget at its rate (None: not running or no rate yet)."""
        if row["status"] != "RUNNING" or not row["budget"]:
            return None
        return cost.eta_s(row["budget"] - row["tokens"], row["rate"])

    def total(self) -> int:
        """The sweep's trials (under the bracket search, the most it may run)."""
        return max(self.expected, len(self.rows))

    def sweep_eta_s(self) -> Optional[float]:
        if self.started_at is None:
            return None
        now, rows = self.clock(), self.rows.values()
        walls = [r["wall"] for r in rows if r["status"] in ENDED and r["wall"] is not None]
        running = [now - r["started"] for r in rows if r["status"] == "RUNNING" and r["started"] is not None]
        return cost.sweep_eta_s(now - self.started_at, walls, running, self.total())

    def counts(self) -> str:
        """'3/32 ended, 2 running on 1.6 CPUs, 27 pending' (the bracket search: '3 ended of up to 32, ...')."""
        ended = sum(r["status"] in ENDED for r in self.rows.values())
        running = [r for r in self.rows.values() if r["status"] == "RUNNING"]
        held = {k: sum(r["holds"].get(k, 0.0) for r in running) for k in ("CPU", "GPU")}
        on = " + ".join(f"{v:g} {k}s" for k, v in held.items() if v)
        running_on = f"{len(running)} running" + (f" on {on}" if on else "")
        if self.bound_only:
            pending = sum(r["status"] == "PENDING" for r in self.rows.values())
            return f"{ended} ended of up to {self.total()}, {running_on}, {pending} pending"
        return f"{ended}/{self.total()} ended, {running_on}, {self.total() - ended - len(running)} pending"

    def eta(self) -> str:
        """'ETA 6m 10s', 'ETA at most 6m 10s' (the bracket search), or why there is none yet."""
        eta = self.sweep_eta_s()
        if eta is None:
            return "ETA -" if self.started_at is None else "ETA after the first trial ends"
        return f"ETA {'at most ' if self.bound_only and eta else ''}{cost.format_duration(eta)}"

    def title(self, compact: bool = False) -> str:
        return f"{'' if compact else 'sweep '}{self.sweep.name}: {self.counts()}; {self.eta()}"

    def best_so_far(self) -> str:
        """The finished trial with the lowest eval loss; at equal tokens the smallest batch tends
        to win, so this is progress, not the answer (the report's, at the end)."""
        done = [r for r in self.rows.values() if r["status"] == "DONE" and r["eval"] is not None]
        if not done:
            return "best so far: none finished yet"
        best = min(done, key=lambda r: r["eval"])
        return f"best so far: {best['name']}, eval {best['eval']:.3f}"

    def listed(self) -> Tuple[List[Dict[str, Any]], Optional[str]]:
        """(the rows to list, in Tune's order; a line counting the rest, None when none is left out)."""
        rows = list(self.rows.values())
        if len(rows) <= ALL_ROWS_UP_TO:
            return rows, None
        finished = [r for r in rows if r["status"] == "DONE" and r["eval"] is not None]
        keep = {id(r) for r in rows if r["status"] == "RUNNING"}
        keep |= {id(r) for r in sorted(finished, key=lambda r: r["eval"])[:BEST_LISTED]}
        keep |= {id(r) for r in [r for r in rows if r["status"] == "ERROR"][-BEST_LISTED:]}
        rest = Counter(r["status"].lower() for r in rows if id(r) not in keep)
        counted = ", ".join(f"{n} {status}" for status, n in sorted(rest.items()))
        note = (
            f"... {sum(rest.values())} more not listed ({counted}): the running, the {BEST_LISTED} best "
            f"finished and the latest failed are"
        )
        return [r for r in rows if id(r) in keep], note

    def cells(self, row: Dict[str, Any]) -> List[str]:
        done = row["tokens"] / row["budget"] if row["budget"] else None
        return [
            row["name"],
            _fmt(row["B"], ",d"),
            _fmt(row["lr"], ".2e"),
            _fmt(row["warmup"], ",d"),
            _fmt(row["tokens"], ",d"),
            _fmt(done, ".0%"),
            cost.format_duration(self.trial_eta_s(row)),
            _fmt(row["loss"], ".3f"),
            _fmt(row["eval"], ".3f"),
            row["status"],
        ]

    # ------------------------------------------------------------ showing them

    def _is_live(self) -> bool:
        return self.console is not None or sys.stdout.isatty()

    def _changed(self, what: str) -> None:
        """A trial started or ended: the live table redrawn, or one line in a log."""
        if self._is_live():
            self._show_live()
        else:
            self._line(what)

    def _line(self, text: str) -> None:
        self.last_print = self.clock()
        since = cost.format_duration(self.last_print - self.started_at) if self.started_at is not None else "-"
        print(f"[{since:>7}] {text}", flush=True)

    def print(self) -> None:
        """The plain table (CI and log files)."""
        self.last_print = self.clock()
        rows, rest = self.listed()
        widths = [w for _, w, _ in COLUMNS]
        widths[0] = max([len("trial")] + [len(r["name"]) for r in rows])  # whole names: none reads as another

        def line(values: List[str]) -> str:
            cells = (f"{v:>{w}}" if right else f"{v:<{w}}" for v, w, (_, _, right) in zip(values, widths, COLUMNS))
            return " ".join(cells).rstrip()

        lines = [f"--- {self.title()} ---", line([c[0] for c in COLUMNS])]
        lines += [line(self.cells(row)) for row in rows]
        lines += [rest] if rest else []
        lines.append(self.best_so_far())
        print("\n".join(lines), flush=True)

    def rich_table(self):
        """The same figures, narrower (fits 80 columns): warmup is in the trial's name."""
        from rich import box
        from rich.table import Table

        rows, rest = self.listed()
        table = Table(
            title=self.title(compact=True),
            title_justify="left",
            caption="\n".join(filter(None, [rest, self.best_so_far()])),
            caption_justify="left",
            box=box.SIMPLE_HEAD,
            pad_edge=False,
            collapse_padding=True,
        )
        table.add_column("trial", overflow="fold", min_width=12)  # the one column that may wrap
        for header in ("B", "lr", "tokens", "done", "ETA", "loss", "eval"):
            table.add_column(header, justify="right", no_wrap=True)
        table.add_column("status", no_wrap=True)
        for row in rows:
            cells = self.cells(row)
            lr = _fmt(row["lr"], ".1e")
            table.add_row(row["name"], cell(row["B"], TOK), lr, cell(row["tokens"], TOK), *cells[5:])
        return table

    def _show_live(self) -> None:
        if self._live is None:
            from rich.console import Console
            from rich.live import Live

            self._live = Live(self.rich_table(), console=self.console or Console(), auto_refresh=False)
            self._live.start()
            _LIVE.append(self._live)
        self._live.update(self.rich_table(), refresh=True)

    def stop(self) -> None:
        """Stop refreshing in place (the last table stays on screen)."""
        if self._live is not None:
            self._live.stop()
            if self._live in _LIVE:
                _LIVE.remove(self._live)
            self._live = None
