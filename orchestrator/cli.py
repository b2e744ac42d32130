"""Command line: parse argv, call one function per verb, map errors to exit codes.

Exit codes: 0 success, 2 bad config or arguments (one line on stderr, no traceback),
1 a failure during the run, 3 `submit --follow` / `jobs logs --follow` lost contact with a job
that may still be running. Heavy imports (Ray, DeepSpeed, MLflow) happen inside the verbs so
that `plan` and argument errors answer at once.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import List, Optional

from orchestrator import logs
from orchestrator.errors import ConfigError


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2 (argparse prints usage + message)
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        raise SystemExit(2)


def _config_args(p: argparse.ArgumentParser, what: str = "CONFIG") -> None:
    p.add_argument(what.lower(), metavar=what, help="YAML file")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="OmegaConf dotlist overrides")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="orchestrator", description=__doc__.splitlines()[0])
    verbs = parser.add_subparsers(dest="verb", required=True, parser_class=_Parser)

    p = verbs.add_parser("plan", help="resolve a train config: S, b, D, A, steps, warmup, LR (no Ray)")
    _config_args(p)
    p.add_argument("--json", action="store_true", help="print one JSON object")

    p = verbs.add_parser("train", help="one run on Ray Train, logged to MLflow")
    _config_args(p)

    p = verbs.add_parser("sweep", help="a Ray Tune sweep; one MLflow child run per trial")
    _config_args(p, "SWEEP")
    p.add_argument("--resume", action="store_true", help="continue an interrupted sweep")

    p = verbs.add_parser("report", help="plots and critical-batch analysis from MLflow")
    p.add_argument("target", metavar="SWEEP_OR_RUN", help="sweep file, sweep name, or MLflow run id")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="e.g. tracking.uri=...")
    p.add_argument("--out", default=None, help="output folder (default reports/<name>)")
    p.add_argument("--target-loss", type=float, action="append", default=None, help="loss level(s) for B_crit")

    p = verbs.add_parser("submit", help="send a sweep to a Ray cluster (Ray Jobs API)")
    _config_args(p, "SWEEP")
    p.add_argument("--address", required=True, help="Ray dashboard address, e.g. http://127.0.0.1:8265")
    p.add_argument(
        "--follow",
        action="store_true",
        help="stream logs; exit code follows the job's (3: lost contact, the job may still run)",
    )
    p.add_argument("--resume", action="store_true", help="pass --resume to the sweep")
    p.add_argument("--insecure", action="store_true", help="send the Ray auth token over plain http to another machine")
    p.add_argument(
        "--no-fit-check",
        dest="fit_check",
        action="store_false",
        help="skip checking the trial shapes against the cluster's nodes (a cluster that autoscales)",
    )

    p = verbs.add_parser("jobs", help="status | logs | stop | list of submitted jobs")
    p.add_argument("action", choices=["status", "logs", "stop", "list"])
    p.add_argument("job_id", nargs="?", help="submission id (not for list)")
    p.add_argument("--address", required=True, help="Ray dashboard address")
    p.add_argument("--follow", action="store_true", help="logs: stream until the job ends (3: lost contact)")
    p.add_argument("--insecure", action="store_true", help="send the Ray auth token over plain http to another machine")

    p = verbs.add_parser("ui", help="MLflow UI on 127.0.0.1 over the project's tracking store")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="e.g. tracking.uri=...")
    p.add_argument("--port", type=int, default=5000)
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")

    p = verbs.add_parser("prepare", help="tokenize a config's corpus into reusable token shards")
    _config_args(p)
    p.add_argument("--out", required=True, help="shard folder (then use data.shard_dir=...)")
    return parser


def _plan(args: argparse.Namespace) -> int:
    from orchestrator import config, plan

    info = plan.describe(config.load(args.config, args.overrides))
    print(json.dumps(info, indent=2) if args.json else plan.format_table(info))
    return 0


def _train(args: argparse.Namespace) -> int:
    from orchestrator import config, launch

    return launch.train(config.load(args.config, args.overrides))


def _sweep(args: argparse.Namespace) -> int:
    from orchestrator import sweep

    return sweep.run(args.sweep, args.overrides, resume=args.resume)


def _report(args: argparse.Namespace) -> int:
    from orchestrator import report

    return report.run(args.target, args.overrides, out=args.out, target_losses=args.target_loss)


def _submit(args: argparse.Namespace) -> int:
    from orchestrator import submit

    return submit.submit(
        args.sweep,
        args.overrides,
        address=args.address,
        follow=args.follow,
        resume=args.resume,
        insecure=args.insecure,
        fit_check=args.fit_check,
    )


def _jobs(args: argparse.Namespace) -> int:
    from orchestrator import ray_jobs

    return ray_jobs.jobs(args.action, args.job_id, address=args.address, follow=args.follow, insecure=args.insecure)


def _ui(args: argparse.Namespace) -> int:
    from orchestrator import config, tracking

    return tracking.serve_ui(config.load(None, args.overrides), host=args.host, port=args.port)


def _prepare(args: argparse.Namespace) -> int:
    from orchestrator import config
    from workloads import corpus

    cfg = config.load(args.config, args.overrides)
    written = corpus.prepare_shards(cfg, args.out)
    print(f"wrote {written} token shards to {args.out}; train with data.shard_dir={args.out}")
    return 0


VERBS = {
    "plan": _plan,
    "train": _train,
    "sweep": _sweep,
    "report": _report,
    "submit": _submit,
    "jobs": _jobs,
    "ui": _ui,
    "prepare": _prepare,
}


def main(argv: Optional[List[str]] = None) -> int:
    parser = build_parser()
    # Overrides may come after options too (`submit SWEEP --address URL k=v`).
    args, extra = parser.parse_known_args(argv)
    if extra and hasattr(args, "overrides") and all("=" in e and not e.startswith("-") for e in extra):
        args.overrides += extra
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    logs.setup()
    try:
        return VERBS[args.verb](args)
    except ConfigError as exc:
        print(f"orchestrator {args.verb}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"orchestrator {args.verb}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
