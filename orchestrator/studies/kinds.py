"""The kinds of study a sweep file may ask for, and the one place that tells which it asks for
(`kind_of`): a kind whose section the file has (a ladder, a branch study, a registered kind's),
else the kind `search.algorithm` names. `load` and `prepare` read a sweep file with every kind's
section and the rules of its own kind; `register` adds a kind (a module of its own, or a class in
a test) without touching this package.
"""

from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Sequence

from orchestrator.core import sweep_file
from orchestrator.core.errors import ConfigError
from orchestrator.core.sweep_schema import Section, Sweep
from orchestrator.studies.bracket import BracketKind
from orchestrator.studies.branch_study import BranchKind
from orchestrator.studies.grid import GridKind, RandomKind
from orchestrator.studies.ladder import LadderKind
from orchestrator.studies.optuna_search import OptunaKind
from orchestrator.studies.search_space import Trial
from orchestrator.studies.study import Prepared, Rule, StudyKind, validated_base

KINDS: List[StudyKind] = [LadderKind(), BranchKind(), BracketKind(), OptunaKind(), RandomKind(), GridKind()]
"""Every kind, those with a section first (a ladder before a branch study: a ladder refuses one)."""


def register(kind: StudyKind) -> StudyKind:
    """Add a kind of study, ahead of the built-in ones: one with a section of its own
    (`kind.section`), which no other kind has, or one that a `search.algorithm` of
    sweep_schema.ALGORITHMS names (the file's row checks the word). Registering the same class
    again replaces it."""
    others = [k for k in KINDS if type(k) is not type(kind)]
    if kind.section is not None and kind.section.key in {k.section.key for k in others if k.section}:
        raise ValueError(f"a kind of study with section {kind.section.key!r} is registered already")
    if kind.section is None and kind.algorithm is None:
        raise ValueError(f"{type(kind).__name__} needs a section or a search.algorithm that asks for it")
    KINDS[:] = [kind, *others]
    return kind


def sections() -> Dict[str, Section]:
    """The sections registered kinds add to the sweep file, by key."""
    return {k.section.key: k.section for k in KINDS if k.section is not None}


def kind_of(sweep: Sweep) -> StudyKind:
    """The sweep's kind: the one whose section the file has, else the one search.algorithm names.
    A kind with a section runs its own search (its search_tag): another algorithm, a second kind's
    section, or a scheduler it does not take, is refused with the kind's words."""
    present = [k for k in KINDS if k.present(sweep)]
    algorithm = sweep.search.algorithm  # the one place the code reads it
    if not present:
        return next(k for k in KINDS if k.algorithm == algorithm)
    kind = present[0]
    refused_scheduler = not kind.takes_scheduler and sweep.scheduler.type != "none"
    if len(present) > 1 or algorithm != kind.search_tag or refused_scheduler:
        key, message = kind.needs
        raise ConfigError(key or kind.section.key, message or f"runs search.algorithm {kind.search_tag}")
    return kind


def _rules_of(sweep: Sweep) -> Sequence[Rule]:
    kind = kind_of(sweep)
    return (_keys_of(kind),) + kind.rules


def _keys_of(kind: StudyKind) -> Rule:
    """Keys another kind reads alone (search.optuna_storage outside Optuna), and keys the kind
    refuses (a single sweep's loss_tolerance in a ladder), are refused."""

    def rule(sweep: Sweep) -> None:
        for other in KINDS:
            for key in other.own_keys:
                if other is not kind and sweep.written.get(key) is not None:
                    raise ConfigError(key, f"only with search.algorithm: {other.search_tag} (got {kind.search_tag})")
        for key, why in kind.refused_keys.items():
            if key in sweep.written:
                raise ConfigError(key, why)

    return rule


def load(path: str | Path) -> Sweep:
    """Read and check a sweep file: its keys, the rules of every sweep and those of its kind."""
    return sweep_file.load(path, sections=sections(), kind_rules=_rules_of)


def prepare(sweep_path: str | Path, overrides: Sequence[str] = ()) -> Prepared:
    """Load the sweep file, add the overrides to its base, load the base (a bad one fails here) and
    plan the trials by the sweep's kind."""
    sweep = load(sweep_path)
    sweep.base_overrides += list(overrides)
    return kind_of(sweep).plan(sweep, validated_base(sweep))


def expand(sweep: Sweep) -> List[Trial]:
    """Every trial the sweep's kind lists before it starts (a bracket search's first round), feasible or not."""
    return kind_of(sweep).trials(sweep) or []
