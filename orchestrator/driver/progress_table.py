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
from orchestrator.reporting.report_format import TOK, cell, fmt_tokens
from orchestrator.sweeps import placement, search_space

PRINT_EVERY_S = 20.0
ENDED = ("DONE", "STOPPED", "ERROR")
ALL_ROWS_UP_TO = 30
"""Up to this many trials the table lists every one. Past it, the running trials, the best finished
ones and the failed ones, and a count of the rest: a sweep of hundreds stays readable, and a
refresh costs about the same at any size."""
BEST_LISTED = 5
"""Finished trials (lowest eval loss first), and failed ones (latest), listed past ALL_ROWS_UP_TO."""
COLUMNS = [  # (header, width, right-aligned)
    ("trial", 28, False),
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

    ETAs (arithmetic in orchestrator/formulas/cost.py). A trial's rate is its tokens since its
    first result (after a restart, since the first result of the restart) over the time since
    then; its ETA is its remaining tokens at that rate. The sweep's rate is every token any
    trial trained over the time since the first trial started: the pace the slots have kept,
    start-ups and evaluations included, so it neither blanks nor jumps when a trial starts or
    ends. The sweep's ETA is the remaining tokens of every trial
    not ended (running, pending, and the trials Tune has not created yet at the mean budget of
    the known ones) at that rate; trials early stopping cuts short make it late.

    On a terminal the table refreshes in place (rich) whenever a result arrives; otherwise (CI,
    log files) it is printed every 20 s and whenever a trial ends. `clock` and `console` (a
    rich Console: live display on it) are for tests."""

    def __init__(
        self, sweep: sweep_schema.Sweep, clock: Callable[[], float] = time.monotonic, console: Any = None
    ) -> None:
        self.sweep = sweep
        self.rows: Dict[str, Dict[str, Any]] = {}
        self.expected = 0
        self.clock = clock
        self.console = console
        self.last_print = -math.inf
        self.started_at: Optional[float] = None  # the first trial's start
        self._live: Any = None
        self._base: Optional[Config] = None  # search_space.base_of(sweep), read at the first row

    def __getstate__(self) -> Dict[str, Any]:  # Tune may pickle its callbacks; a Live display cannot be
        return {**self.__dict__, "_live": None}

    def setup(self, stop=None, num_samples=None, total_num_samples=None, **info):
        self.expected = total_num_samples or 0

    def _row(self, trial) -> Dict[str, Any]:
        if trial.trial_id not in self.rows:
            self._base = self._base or search_space.base_of(self.sweep)
            resolved = search_space.resolve(self.sweep, trial.config["trial"], self._base)
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
                "first": None,  # (tokens, time) of the first result since the trial (re)started
                "rate": None,
                "gained": 0,  # tokens trained, over every attempt
                "holds": placement.resources_of(self.sweep, c),  # what Tune reserves for it
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
        self._row(trial).update(status="RUNNING", first=None, rate=None)
        if self._is_live():  # the plain table waits for results
            self._show_live()

    def on_trial_result(self, iteration, trials, trial, result, **info):
        self._know(trials)
        row = self._row(trial)
        now = self.clock()
        tokens = result.get("tokens", row["tokens"])
        row["gained"] += max(0, tokens - row["tokens"])  # a restart goes back to its checkpoint: none
        if self.started_at is None:  # a resumed sweep's first result
            self.started_at = now
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
        self._refresh(force=False)

    def on_trial_complete(self, iteration, trials, trial, **info):
        row = self._row(trial)
        row["status"] = "STOPPED" if row["budget"] and row["tokens"] < row["budget"] * 0.99 else "DONE"
        self._refresh(force=True)

    def on_trial_error(self, iteration, trials, trial, **info):
        self._row(trial)["status"] = "ERROR"
        self._refresh(force=True)

    def on_experiment_end(self, trials, **info):
        self.stop()

    # ------------------------------------------------------------ the figures

    def trial_eta_s(self, row: Dict[str, Any]) -> Optional[float]:
        """Seconds until a running trial reaches its budget at its rate (None: not running or no rate yet)."""
        if row["status"] != "RUNNING" or not row["budget"]:
            return None
        return cost.eta_s(row["budget"] - row["tokens"], row["rate"])

    def remaining_tokens(self) -> float:
        """Tokens still to train: every trial not ended, and the trials Tune has not created yet."""
        budgets = [r["budget"] for r in self.rows.values() if r["budget"]]
        left = sum(
            max(0, r["budget"] - r["tokens"]) for r in self.rows.values() if r["budget"] and r["status"] not in ENDED
        )
        unseen = max(0, self.expected - len(self.rows))
        return left + (unseen * sum(budgets) / len(budgets) if budgets else 0.0)

    def sweep_rate(self) -> Optional[float]:
        """Tokens/s the sweep has kept since its first trial started (None before any progress)."""
        if self.started_at is None:
            return None
        return cost.rate(0, self.started_at, sum(r["gained"] for r in self.rows.values()), self.clock())

    def sweep_eta_s(self) -> Optional[float]:
        return cost.eta_s(self.remaining_tokens(), self.sweep_rate())

    def counts(self) -> str:
        """'3/32 ended, 2 running on 1.6 CPUs, 27 pending'."""
        ended = sum(r["status"] in ENDED for r in self.rows.values())
        running = [r for r in self.rows.values() if r["status"] == "RUNNING"]
        total = max(self.expected, len(self.rows))
        held = {k: sum(r["holds"].get(k, 0.0) for r in running) for k in ("CPU", "GPU")}
        on = " + ".join(f"{v:g} {k}s" for k, v in held.items() if v)
        running_on = f"{len(running)} running" + (f" on {on}" if on else "")
        return f"{ended}/{total} ended, {running_on}, {total - ended - len(running)} pending"

    def title(self, compact: bool = False) -> str:
        rate, eta, left = self.sweep_rate(), self.sweep_eta_s(), self.remaining_tokens()
        if compact:  # the rich table's title, which should fit 80 columns
            how = f"{fmt_tokens(left)} tokens at {fmt_tokens(rate)}/s" if rate else "no rate yet" if left else "done"
            return f"{self.sweep.name}: {self.counts()}; ETA {cost.format_duration(eta)} ({how})"
        how = f"{left:,.0f} tokens left at {rate:,.0f} tokens/s" if rate else "no rate yet" if left else "none left"
        return f"sweep {self.sweep.name}: {self.counts()}; ETA {cost.format_duration(eta)} ({how})"

    def best_so_far(self) -> str:
        """The finished trial with the lowest eval loss; at equal tokens the smallest batch tends
        to win, so this is progress, not the answer (the critical batch size is, at the end)."""
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
            row["name"][:28],
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

    def _refresh(self, force: bool) -> None:
        if self._is_live():
            self._show_live()
        elif force or self.clock() - self.last_print > PRINT_EVERY_S:
            self.print()

    def print(self) -> None:
        """The plain table (CI and log files)."""
        self.last_print = self.clock()

        def line(values: List[str]) -> str:
            return " ".join(f"{v:>{w}}" if right else f"{v:<{w}}" for v, (_, w, right) in zip(values, COLUMNS))

        rows, rest = self.listed()
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
