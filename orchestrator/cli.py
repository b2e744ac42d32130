"""Command line: parse argv, call one function per verb, map errors to exit codes.

Exit codes: 0 success, 2 bad config or arguments (one line on stderr, no traceback),
1 a failure during the run, 3 `submit --follow` / `jobs logs --follow` lost contact with a job
that may still be running. Heavy imports (Ray, DeepSpeed, MLflow) happen inside the verbs so
that `plan` and argument errors answer at once.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
from pathlib import Path
from typing import List, Optional

from orchestrator import __version__
from orchestrator.core import logs
from orchestrator.core.errors import ConfigError
from orchestrator.formulas import cost


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2 (argparse prints usage + message)
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        raise SystemExit(2)


def _config_args(p: argparse.ArgumentParser, what: str = "CONFIG") -> None:
    p.add_argument(what.lower(), metavar=what, help="YAML file")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="OmegaConf dotlist overrides")


DRY_RUN_OPTIONS = [
    ("--mfu", float, "share of the peak FLOP/s a trial achieves (default 0.4 on GPU)"),
    (
        "--peak-flops",
        float,
        f"peak FLOP/s of one GPU (default {cost.GPU_PEAK_FLOPS:g}) or CPU thread (default: measured)",
    ),
    ("--device-memory", str, "memory of one worker's device for `auto` micro-batches, e.g. 80GiB"),
    ("--startup-s", float, "start-up seconds per trial (default 60 on GPU, 15 on CPU)"),
]


def _port(text: str) -> int:
    """A TCP port, 1..65535 (argparse turns the ValueError into one line and exit 2)."""
    port = int(text)
    if not 1 <= port <= 65535:
        raise ValueError(text)
    return port


_port.__name__ = "port (1..65535)"  # what argparse names in "invalid port (1..65535) value"


def _positive(what: str, least: float = 0.0):
    """An argparse type: a finite number > 0, and >= `least` where given (a NaN would compare false
    everywhere, a negative loss is never reached, a ladder's N or D counts parameters or tokens),
    named `what` in argparse's one line."""

    def parse(text: str) -> float:
        value = float(text)
        if not (math.isfinite(value) and value > 0 and value >= least):
            raise ValueError(text)
        return value

    parse.__name__ = what  # what argparse names in "invalid <what> value"
    return parse


_loss = _positive("loss (a finite number > 0)")
"""--target-loss."""
_count = _positive("count (a finite number >= 1, e.g. 1e9)", least=1.0)
"""A ladder's target N or D (1e9 and 1000000000 alike)."""


def _share(text: str) -> float:
    """A share strictly between 0 and 1 (--loss-tolerance: 0.005 is half a percent of the loss)."""
    value = float(text)
    if not 0 < value < 1:
        raise ValueError(text)
    return value


_share.__name__ = "share (a number between 0 and 1, e.g. 0.005 for 0.5%)"


def _out_folder(text: str) -> str:
    """A folder to write into: new, or an existing folder, not a file."""
    if not text.strip() or Path(text).exists() and not Path(text).is_dir():
        raise ValueError(text)
    return text


_out_folder.__name__ = "folder (not an existing file)"


EXAMPLES = {
    "plan": ["conf/train/tiny.yaml", "conf/train/gpt-350m.yaml batch.micro_batch_size=auto --device-memory 80GiB"],
    "train": [
        "conf/train/tiny.yaml optim.lr=3e-3",
        "conf/train/tiny.yaml train.run_name=mine  # the same command again resumes it",
        "conf/train/tiny.yaml --resume  # the newest unfinished run of this config",
    ],
    "sweep": ["conf/sweep/demo.yaml", "conf/sweep/demo.yaml --dry-run", "conf/sweep/demo.yaml --resume"],
    "report": [
        "conf/sweep/demo.yaml",
        "demo --target-loss 2.75 --out reports/demo-at-2.75",
        "reports/demo  # a folder of trials.csv and curves.csv",
    ],
    "submit": ["conf/sweep/gpt-350m-cluster.yaml --address http://127.0.0.1:8265 --follow"],
    "jobs": ["list --address http://127.0.0.1:8265", "logs SUBMISSION_ID --address http://127.0.0.1:8265 --follow"],
    "ui": ["", "tracking.uri=sqlite:///mlflow.db --port 5001"],
    "prepare": [
        "conf/train/tiny.yaml --out shards/tiny",
        "conf/train/tiny.yaml --out shards/bpe --train-tokenizer 8192",
    ],
    "export": ["RUN_ID --out exported", "RUN_ID --out exported --tokens 65536"],
}
"""Shown under each verb's --help; tests/unit/test_cli_help.py parses every one."""


def _verb(verbs, name: str, summary: str, more: str = "") -> argparse.ArgumentParser:
    examples = "\n".join(f"  orchestrator {name} {e}".rstrip() for e in EXAMPLES[name])
    return verbs.add_parser(
        name,
        help=summary,
        description=f"{summary[0].upper()}{summary[1:]}. {more}".strip(),
        epilog=f"examples:\n{examples}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="orchestrator",
        description="Joint batch-size and learning-rate sweeps for language models on Ray Tune, Ray Train and "
        "DeepSpeed, tracked in MLflow: plan, train, sweep, report, submit.",
        epilog="`orchestrator VERB --help` shows a verb's options and examples. Exit codes: 0 done, 1 the run "
        "failed, 2 bad input (nothing started), 3 lost contact with a submitted job.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    verbs = parser.add_subparsers(dest="verb", required=True, parser_class=_Parser, metavar="VERB")
    _add_plan(verbs)
    _add_train(verbs)
    _add_sweep(verbs)
    _add_report(verbs)
    _add_submit(verbs)
    _add_jobs(verbs)
    _add_ui(verbs)
    _add_prepare(verbs)
    _add_export(verbs)
    return parser


def _add_plan(verbs: "argparse._SubParsersAction") -> None:
    p = _verb(verbs, "plan", "resolve a train config: S, b, D, A, steps, warmup, LR (no Ray)")
    _config_args(p)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument(
        "--device-memory",
        default=None,
        metavar="SIZE",
        help="memory of one worker's device for the memory model, e.g. 80GiB (default: the visible one)",
    )


def _add_train(verbs: "argparse._SubParsersAction") -> None:
    p = _verb(verbs, "train", "one run on Ray Train, logged to MLflow")
    _config_args(p)
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue the run train.run_name names, else the newest unfinished run of this config",
    )


def _add_sweep(verbs: "argparse._SubParsersAction") -> None:
    p = _verb(verbs, "sweep", "a Ray Tune sweep; one MLflow child run per trial")
    _config_args(p, "SWEEP")
    p.add_argument("--resume", action="store_true", help="continue an interrupted sweep")
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="print the trials with their cost, memory and ETA; start nothing, write nothing",
    )
    for flag, kind, what in DRY_RUN_OPTIONS:
        p.add_argument(flag, type=kind, default=None, help=f"--dry-run only: {what}")
    p.add_argument("--all", action="store_true", help="--dry-run only: list every trial (default: the first and last)")


def _add_report(verbs: "argparse._SubParsersAction") -> None:
    p = _verb(verbs, "report", "plots and critical-batch analysis from MLflow or from tables")
    p.add_argument(
        "target",
        metavar="SWEEP_OR_RUN",
        help="sweep file, sweep name, MLflow run id, or a folder of trials.csv + curves.csv",
    )
    p.add_argument("overrides", nargs="*", metavar="key=value", help="e.g. tracking.uri=...")
    p.add_argument("--out", type=_out_folder, default=None, help="output folder (default reports/<name>)")
    p.add_argument("--target-loss", type=_loss, action="append", default=None, help="loss level(s) for B_crit")
    p.add_argument(
        "--lr-criterion",
        choices=("final_loss", "steps"),
        default=None,
        help="the one best lr per batch size the report names, and recommends: lowest final loss (the "
        "default, whatever the search scored lrs by), or fewest steps to the primary target",
    )
    p.add_argument(
        "--ui-port",
        type=_port,
        default=5000,
        help="the port of `orchestrator ui` its printed links open (default 5000)",
    )
    p.add_argument(
        "--target-params",
        type=_count,
        default=None,
        metavar="N",
        help="a ladder's target model size, as model.params counts it (overrides the sweep file's ladder.target)",
    )
    p.add_argument(
        "--target-tokens",
        type=_count,
        default=None,
        metavar="D",
        help="a ladder's target budget in tokens (overrides the sweep file's ladder.target)",
    )
    p.add_argument(
        "--loss-tolerance",
        type=_share,
        default=None,
        metavar="SHARE",
        help="the share of the final loss to trade for a larger batch: the recommendation is the largest batch "
        "predicted within it of the loss-optimal batch's loss (default: the sweep file's loss_tolerance or "
        "ladder.tolerance, else 0.005); not branch.tolerance",
    )


def _add_submit(verbs: "argparse._SubParsersAction") -> None:
    p = _verb(
        verbs,
        "submit",
        "send a sweep to a Ray cluster (Ray Jobs API)",
        "The working directory travels without credential files (the list: orchestrator/cluster/upload.py) "
        "and without what .gitignore and .rayignore name: add your own patterns to .rayignore.",
    )
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
    secrets_from = p.add_mutually_exclusive_group()
    secrets_from.add_argument(
        "--secrets-on-cluster",
        dest="secrets_from",
        action="store_const",
        const="on-cluster",
        help="send no MLflow credential or ${oc.env:X} value: the cluster's own environment has them",
    )
    secrets_from.add_argument(
        "--send-secrets",
        dest="secrets_from",
        action="store_const",
        const="send",
        help="copy them into the job's runtime_env, where anyone holding the cluster's Ray token can read them",
    )


def _add_jobs(verbs: "argparse._SubParsersAction") -> None:
    p = _verb(verbs, "jobs", "status | logs | stop | list of submitted jobs")
    p.add_argument("action", choices=["status", "logs", "stop", "list"])
    p.add_argument("job_id", nargs="?", help="submission id (not for list)")
    p.add_argument("--address", required=True, help="Ray dashboard address")
    p.add_argument("--follow", action="store_true", help="logs: stream until the job ends (3: lost contact)")
    p.add_argument("--insecure", action="store_true", help="send the Ray auth token over plain http to another machine")


def _add_ui(verbs: "argparse._SubParsersAction") -> None:
    p = _verb(verbs, "ui", "MLflow UI on 127.0.0.1 over the project's tracking store")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="e.g. tracking.uri=...")
    p.add_argument("--port", type=_port, default=5000, help="1..65535, free on --host (default 5000)")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    p.add_argument(
        "--sweep", default=None, help="the sweep whose trials its printed link compares (default: the newest)"
    )


def _add_prepare(verbs: "argparse._SubParsersAction") -> None:
    p = _verb(verbs, "prepare", "tokenize a config's corpus into reusable token shards")
    _config_args(p)
    p.add_argument("--out", type=_out_folder, required=True, help="shard folder (then use data.shard_dir=...)")
    p.add_argument(
        "--train-tokenizer",
        type=int,
        metavar="VOCAB",
        default=None,
        help="first train a byte-level BPE tokenizer of VOCAB tokens on the sources' training split, offline",
    )


def _add_export(verbs: "argparse._SubParsersAction") -> None:
    p = _verb(verbs, "export", "a run's checkpoint as one fp32 safetensors state dict with its config")
    p.add_argument("target", metavar="RUN_OR_TRIAL", help="MLflow run id, run name or Tune trial id")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="e.g. tracking.uri=...")
    p.add_argument("--out", required=True, metavar="DIR", help="folder to write (new or empty)")
    p.add_argument(
        "--checkpoint",
        default=None,
        metavar="PATH_OR_URI",
        help="a checkpoint folder, or a folder of checkpoint_* folders, instead of where the run keeps them",
    )
    p.add_argument("--tokens", type=int, default=None, metavar="N", help="the checkpoint at N tokens (default: last)")


def _plan(args: argparse.Namespace) -> int:
    from orchestrator.core import config
    from orchestrator.driver import plan
    from orchestrator.formulas import memory

    device_memory = memory.parse_bytes(args.device_memory) if args.device_memory else None
    info = plan.describe(config.load(args.config, args.overrides), device_memory)
    print(json.dumps(info, indent=2) if args.json else plan.format_table(info))
    return 0


def _train(args: argparse.Namespace) -> int:
    from orchestrator.core import config
    from orchestrator.driver import launch

    return launch.train(config.load(args.config, args.overrides), resume=args.resume)


def _check_sweep_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    given = [flag for flag, _, _ in DRY_RUN_OPTIONS if getattr(args, flag[2:].replace("-", "_")) is not None]
    given += ["--all"] if args.all else []
    if given and not args.dry_run:
        parser.error(f"{', '.join(given)} only with --dry-run")
    if args.dry_run and args.resume:
        parser.error("--resume and --dry-run exclude each other")


def _sweep(args: argparse.Namespace) -> int:
    if args.dry_run:  # imports no Ray and no MLflow
        from orchestrator.driver import dry_run
        from orchestrator.formulas import memory

        options = dry_run.Options(
            mfu=args.mfu,
            peak_flops=args.peak_flops,
            startup_s=args.startup_s,
            device_memory=memory.parse_bytes(args.device_memory) if args.device_memory else None,
            list_all=args.all,
        )
        return dry_run.run(args.sweep, args.overrides, options)
    from orchestrator.driver import sweep

    return sweep.run(args.sweep, args.overrides, resume=args.resume)


def _report(args: argparse.Namespace) -> int:
    from orchestrator.reporting import report

    return report.run(
        args.target,
        args.overrides,
        out=args.out,
        target_losses=args.target_loss,
        lr_criterion=args.lr_criterion,
        ui_port=args.ui_port,
        target_params=args.target_params,
        target_tokens=args.target_tokens,
        loss_tolerance=args.loss_tolerance,
    )


def _submit(args: argparse.Namespace) -> int:
    from orchestrator.cluster import submit

    return submit.submit(
        args.sweep,
        args.overrides,
        address=args.address,
        follow=args.follow,
        resume=args.resume,
        insecure=args.insecure,
        fit_check=args.fit_check,
        secrets_from=args.secrets_from,
    )


def _jobs(args: argparse.Namespace) -> int:
    from orchestrator.cluster import jobs

    return jobs.run(args.action, args.job_id, address=args.address, follow=args.follow, insecure=args.insecure)


def _ui(args: argparse.Namespace) -> int:
    from orchestrator.core import config
    from orchestrator.tracking import mlflow_ui

    cfg = config.load(None, args.overrides)
    _check_free(args.host, args.port)  # before the store is created: nothing half-written
    return mlflow_ui.serve_ui(cfg, host=args.host, port=args.port, sweep=args.sweep)


def _check_free(host: str, port: int) -> None:
    import socket

    try:
        with socket.create_server((host, port)):
            pass
    except OSError as exc:
        what = "in use" if exc.errno in (98, 48) else f"not available ({exc.strerror})"
        raise ConfigError("--port", f"{port} on {host} is {what}; pick another with --port or --host") from None


def _prepare(args: argparse.Namespace) -> int:
    from orchestrator.core import config
    from workloads.text import corpus

    cfg = config.load(args.config, args.overrides)
    corpus.check_prepare_folder(Path(args.out))  # before the tokenizer writes into it
    use = f"data.shard_dir={args.out}"
    if args.train_tokenizer is not None:
        from workloads.text import tokenizer

        if not 258 <= args.train_tokenizer <= tokenizer.MAX_TRAINED_VOCAB:
            raise ConfigError(
                "--train-tokenizer",
                f"got {args.train_tokenizer}; use 258 (256 bytes + EOS + one merge) to {tokenizer.MAX_TRAINED_VOCAB:,}",
            )
    with corpus.removed_on_failure(Path(args.out)):  # the tokenizer's folder too, if the shards then fail
        if args.train_tokenizer is not None:
            path = tokenizer.train_bpe(corpus.training_texts(cfg), args.train_tokenizer, Path(args.out))
            print(f"trained a {args.train_tokenizer:,}-token BPE tokenizer on the training split: {path}")
            cfg = config.load(args.config, [*args.overrides, f"data.tokenizer={path}", "model.vocab_size=null"])
            use = f"data.tokenizer={path} {use}"
        written = corpus.prepare_shards(cfg, args.out)
    print(f"wrote {written} token shards to {args.out}; train with {use}")
    return 0


def _export(args: argparse.Namespace) -> int:
    from orchestrator.export import export

    return export.run(args.target, args.overrides, args.out, checkpoint=args.checkpoint, tokens=args.tokens)


VERBS = {
    "plan": _plan,
    "train": _train,
    "sweep": _sweep,
    "report": _report,
    "submit": _submit,
    "jobs": _jobs,
    "ui": _ui,
    "prepare": _prepare,
    "export": _export,
}


def main(argv: Optional[List[str]] = None) -> int:
    parser = build_parser()
    # Overrides may come after options too (`submit SWEEP --address URL k=v`).
    args, extra = parser.parse_known_args(argv)
    if extra and hasattr(args, "overrides") and all("=" in e and not e.startswith("-") for e in extra):
        args.overrides += extra
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if args.verb == "sweep":
        _check_sweep_args(parser, args)
    logs.setup()
    try:
        return VERBS[args.verb](args)
    except ConfigError as exc:
        print(f"orchestrator {args.verb}: error: {_without_secrets(str(exc))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"orchestrator {args.verb}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `orchestrator plan ... | head`: the reader has what it wanted
        _stdout_to_devnull()
        return 0
    except Exception as exc:  # a failure during the run: its reason in one line, not a traceback
        if traceback_asked():
            import traceback

            print(_without_secrets("".join(traceback.format_exception(exc))), file=sys.stderr, end="")
            return 1
        lines = str(exc).strip().splitlines()
        reason = f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
        print(f"orchestrator {args.verb}: error: {_without_secrets(reason)}", file=sys.stderr)
        return 1


TRACEBACK_ENV = "ORCHESTRATOR_TRACEBACK"
"""1, true or yes: a failure's whole traceback instead of its one line, for reporting a bug (its
URIs' passwords redacted as the one line's are; a local variable's value printed by a library can
still hold one, so it is off by default)."""


def traceback_asked() -> bool:
    return os.environ.get(TRACEBACK_ENV, "").strip().lower() in ("1", "true", "yes")


def _stdout_to_devnull() -> None:
    """After the reader of our output went away, the rest goes nowhere, so no later flush fails."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def _without_secrets(text: str) -> str:
    """What the command prints of an error: a URI in it (a tracking store, a storage location, a
    database) may hold a password, which the config's one rule redacts. Imported here, so that
    argument errors answer before the config's modules load."""
    from orchestrator.core.config import redact_uri

    return redact_uri(text)


def command() -> None:
    """The `orchestrator` command: main(), then a quick exit. When main returns, the work is done
    and recorded; Python's own finalization of what a run imports (torch, DeepSpeed, SciPy,
    matplotlib) would take seconds more, so the command stops Ray, flushes its output and ends."""
    try:
        code = main()
        sys.stdout.flush()
    except BrokenPipeError:  # the output's reader went away while the last lines were flushed
        _stdout_to_devnull()
        code = 0
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    command()
