"""The config's loader (the schema is orchestrator/core/schema.py) and the config as a dict (redacted).

Loading order (later wins): schema defaults <- YAML file (which may build on another YAML
through a top-level `extends: other.yaml`, resolved relative to the file) <- dotlist overrides
(`optim.lr=3e-4`). Every error is a ConfigError naming the key, the value and what is valid.

Reading the YAML files and overrides is orchestrator.core.yaml_files; the cross-field checks are
orchestrator.core.validation; what a config implies (the batch plan, AdamW's constants) is
orchestrator.core.derived.

Pure: imports no Ray, DeepSpeed or MLflow.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import re
from dataclasses import field, fields, is_dataclass
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import yaml
from omegaconf import DictConfig, OmegaConf, ValueNode
from omegaconf.errors import (
    ConfigAttributeError,
    ConfigKeyError,
    InterpolationResolutionError,
    OmegaConfBaseException,
    ValidationError,
)

from orchestrator.core import validation, workload_paths, yaml_files
from orchestrator.core.errors import ConfigError
from orchestrator.core.schema import Config, RampStep
from orchestrator.core.validation import check_override
from orchestrator.core.yaml_files import (
    extends_chain,
    parse_overrides,
)

# ---------------------------------------------------------------- loading

_SECRET_RE = re.compile(r"\$\{oc\.env:")
REDACTED = "***"
_URI_USERINFO = re.compile(r"://([^/?#\s]*)@(?=[^/?#\s@]*(?:[/?#\s]|$))")
"""scheme://user:PASSWORD@host, scheme://TOKEN@host: the userinfo is everything up to the
authority's last '@' (urllib.parse's reading; a password may hold '@' and ':')."""
_QUERY_SECRETS = re.compile(
    r"([?&](?:token|access_token|auth|password|passwd|pwd|secret|api_key|apikey|sig|signature|"
    r"x-amz-signature|x-amz-security-token|x-goog-signature)=)[^&#\s]*",
    re.IGNORECASE,
)
"""Query-string parameters that carry a credential (signed URLs, tokens)."""


def schema_keys(schema: Any = Config, prefix: str = "") -> List[str]:
    """Every leaf key of the schema as a dotted path (lists of sources count as one key)."""
    keys = []
    for f in fields(schema):
        name = f"{prefix}{f.name}"
        default = f.default_factory() if f.default_factory is not field().default_factory else f.default  # type: ignore[misc]
        if is_dataclass(default):
            keys += schema_keys(type(default), name + ".")
        else:
            keys.append(name)
    return keys


UNKNOWN_KEY = (ConfigKeyError, ConfigAttributeError)
"""What OmegaConf raises for a key the schema does not have (by item, by attribute)."""


def did_you_mean(key: str) -> str:
    """`; did you mean <closest schema key>?` (or the valid sections), to end an unknown-key message."""
    scored = sorted((_distance(key, known), known) for known in schema_keys())
    if scored and scored[0][0] <= 0.5:
        return f"; did you mean {scored[0][1]}?"
    sections = [f.name for f in fields(Config)]
    return f"; valid sections: {', '.join(sections)}"


def _distance(key: str, known: str) -> float:
    """How far an unknown dotted key is from a schema key, 0 (the same) to about 1: the edit
    distance of their last parts over the longer one's length, or less where one is the other's
    abbreviation (learning_rate -> lr: the initials of its words) or its start (warmup ->
    warmup_tokens); 0.3 more when the sections differ, so a right name in the wrong section is
    still found."""
    section, _, leaf = key.rpartition(".")
    known_section, _, known_leaf = known.rpartition(".")
    edits = _edits(leaf, known_leaf) / max(len(leaf), len(known_leaf), 1)
    if known_leaf in (_initials(leaf), leaf[:2]) or leaf == _initials(known_leaf):
        edits = min(edits, 0.1)
    elif known_leaf.startswith(leaf) or leaf.startswith(known_leaf):
        edits = min(edits, 0.2)
    return edits + (0.0 if section == known_section else 0.3)


def _initials(name: str) -> str:
    return "".join(word[0] for word in name.split("_") if word)


def _edits(a: str, b: str) -> int:
    """Levenshtein distance: insertions, deletions and substitutions that turn a into b."""
    row = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        previous, row[0] = row[0], i
        for j, y in enumerate(b, 1):
            previous, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, previous + (x != y))
    return row[-1]


def _read_yaml(path: Path) -> Tuple[DictConfig, Any]:
    """One YAML train config merged over the files it `extends`, and its batch.ramp (the nearest
    file's, as OmegaConf merges a list; NO_RAMP when none names one), kept apart: _ramp_steps."""
    layers, ramp = [], NO_RAMP
    for _, raw, _ in reversed(extends_chain(path)):
        batch = raw.get("batch")
        if isinstance(batch, dict) and "ramp" in batch:
            ramp, raw = batch["ramp"], {**raw, "batch": {k: v for k, v in batch.items() if k != "ramp"}}
        layers.append(OmegaConf.create(raw))
    return OmegaConf.merge(*layers), ramp


# ---------------------------------------------------------------- batch.ramp, outside OmegaConf

RAMP = "batch.ramp"
NO_RAMP = object()
"""batch.ramp as no file or override names it (the schema's default)."""


def _ramp_overrides(ramp: Any, overrides: List[tuple]) -> Tuple[Any, List[tuple]]:
    """(the ramp after the overrides of batch.ramp or of one of its steps, the other overrides)."""
    others = []
    for key, value in overrides:
        if key == RAMP:
            ramp = value
        elif key.startswith(f"{RAMP}."):
            ramp = _with_step(ramp, key, value)
        else:
            others.append((key, value))
    return ramp, others


def _with_step(ramp: Any, key: str, value: Any) -> List[Any]:
    """The ramp with `batch.ramp.N=STEP` or `batch.ramp.N.FIELD=VALUE` applied."""
    index, _, name = key[len(RAMP) + 1 :].partition(".")
    steps = [dict(s) if isinstance(s, dict) else s for s in (ramp if isinstance(ramp, list) else [])]
    if not index.isdigit() or int(index) >= len(steps) or (name and not isinstance(steps[int(index)], dict)):
        raise ConfigError(key, f"unknown key: batch.ramp has {len(steps)} steps (0 to {len(steps) - 1})")
    if name:
        steps[int(index)][name] = value
    else:
        steps[int(index)] = value
    return steps


def _ramp_steps(value: Any) -> Optional[List[RampStep]]:
    """batch.ramp as RampSteps of the schema's keys (their values' rules are validation.FIELDS's).
    Read here and not by OmegaConf, which takes about 2 ms a step: a 10,000-step ramp took 30 s."""
    if value is None:
        return None
    shape = "a list of {from_tokens: N, tokens_per_update: B}"
    if not isinstance(value, list):
        raise ConfigError(RAMP, f"got {value!r}; {shape}")
    names = [f.name for f in fields(RampStep)]
    steps = []
    for i, step in enumerate(value):
        if not isinstance(step, dict):
            raise ConfigError(f"{RAMP}.{i}", f"got {step!r}; each step of {shape}")
        for name in [*step, *names]:
            if name not in names:
                raise ConfigError(f"{RAMP}.{i}.{name}", f"unknown key; valid: {', '.join(names)}")
            if name not in step:
                raise ConfigError(f"{RAMP}.{i}.{name}", f"missing; each step of {shape}")
        steps.append(RampStep(**step))
    return steps


def _ramp_apart(data: Dict[str, Any]) -> Tuple[Dict[str, Any], Any]:
    """(a config dict without batch.ramp, its ramp)."""
    batch = dict(data.get("batch") or {})
    ramp = batch.pop("ramp", None)
    return {**data, "batch": batch}, ramp


def _apply_overrides(merged: DictConfig, overrides: List[tuple]) -> None:
    """OmegaConf.update understands list indices (data.sources.0.weight=2) and keeps types."""

    for key, value in overrides:
        check_override(key, value)
        try:
            OmegaConf.update(merged, key, value, merge=isinstance(value, (dict, list)))
        except (OmegaConfBaseException, TypeError, IndexError) as exc:
            if isinstance(exc, OmegaConfBaseException) and not isinstance(exc, UNKNOWN_KEY):
                raise
            inner = getattr(exc, "full_key", None)
            if inner and not key.startswith(inner):  # an unknown key inside a list or dict value
                raise _omegaconf_error(exc) from None
            raise ConfigError(key, f"unknown key{did_you_mean(key)}") from None


def _omegaconf_error(exc: OmegaConfBaseException) -> ConfigError:
    key = re.sub(r"\[(\d+)\]", r".\1", getattr(exc, "full_key", None) or "")  # sources[0].kind -> sources.0.kind
    first = str(exc).splitlines()[0]
    if isinstance(exc, UNKNOWN_KEY):
        return ConfigError(key, f"unknown key{did_you_mean(key)}")
    if isinstance(exc, ValidationError):
        return ConfigError(key, f"{first}")
    if isinstance(exc, InterpolationResolutionError):
        return ConfigError(key, f"cannot resolve: {first}")
    return ConfigError(key, first)


def load(
    path: Optional[str | Path] = None, overrides: Optional[List[str]] = None, validate_config: bool = True
) -> Config:
    """Schema defaults <- YAML (with `extends`) <- dotlist overrides, validated."""
    try:
        merged, ramp = _merged(path, overrides or [])
        secret_keys = sorted(_interpolated_keys(merged, _SECRET_RE))
        cfg: Config = OmegaConf.to_object(merged)  # type: ignore[assignment]
    except OmegaConfBaseException as exc:
        raise _omegaconf_error(exc) from None
    if ramp is not NO_RAMP:
        cfg.batch.ramp = _ramp_steps(ramp)
    if cfg.batch.ramp:  # the ramp's first batch size is the run's batch size at 0
        cfg.batch.tokens_per_update = cfg.batch.ramp[0].tokens_per_update
    cfg.secret_keys = tuple(secret_keys)
    if validate_config:
        follow_tokenizer(cfg)
        validation.validate(cfg)
    return cfg


def _merged(path: Optional[str | Path], overrides: List[str]) -> Tuple[DictConfig, Any]:
    """(schema <- YAML <- overrides as one DictConfig, the batch.ramp kept apart: _ramp_steps)."""
    layers, ramp = [_schema()], NO_RAMP
    if path is not None:
        merged_file, ramp = _read_yaml(Path(path))
        layers.append(merged_file)
    ramp, parsed = _ramp_overrides(ramp, parse_overrides(overrides))
    merged = OmegaConf.merge(*layers)
    _apply_overrides(merged, parsed)
    return merged, ramp


def load_variant(path: str | Path, base_overrides: Sequence[str], overrides: Mapping[str, Any]) -> Config:
    """load(path, base_overrides + dotlist(overrides)), for one of many variants of one base (a
    sweep's trials): the base is merged through OmegaConf once (_plain_base) and each variant's
    scalar overrides are converted by their schema nodes as OmegaConf converts them, then
    validated as load() validates. load() itself answers whatever that cannot stand for: a base
    with interpolations or a batch.ramp, an override of a section, a list item or the ramp, a value
    its node refuses (load() then names it)."""
    own = yaml_files.dotlist(dict(overrides))
    stat = Path(path).stat()
    base = _plain_base(str(Path(path).resolve()), stat.st_mtime_ns, stat.st_size, tuple(base_overrides))
    cfg = _with_scalars(base, parse_overrides(own)) if base else None
    if cfg is None:
        return load(path, [*base_overrides, *own])
    follow_tokenizer(cfg)
    validation.validate(cfg)
    return cfg


@functools.lru_cache(maxsize=8)
def _plain_base(path: str, mtime_ns: int, size: int, overrides: Tuple[str, ...]) -> Optional[Config]:
    """The config of `path` with `overrides`, not validated, when nothing in it is computed from
    anything else (no interpolation, no batch.ramp), so a variant may set its keys directly; None
    otherwise, or when it does not load (load() then says why). Keyed by the file's mtime and
    size: a file rewritten in the same process is read again. Never changed: variants copy it."""
    try:
        merged, ramp = _merged(path, list(overrides))
        if _interpolated_keys(merged) or ramp not in (NO_RAMP, None):
            return None
        return OmegaConf.to_object(merged)  # type: ignore[return-value]
    except (OmegaConfBaseException, ConfigError):
        return None


def _with_scalars(base: Config, parsed: List[tuple]) -> Optional[Config]:
    """A copy of `base` with each (key, value) set as OmegaConf would set it (check_override, then
    the schema node's validate_and_convert); None when one is not a plain scalar on a leaf of the
    schema or its node refuses it."""
    cfg = copy.deepcopy(base)
    for key, value in parsed:
        if key == RAMP or key.startswith(f"{RAMP}.") or isinstance(value, (dict, list)):
            return None
        if isinstance(value, str) and "${" in value:
            return None
        *sections, leaf = key.split(".")
        node: Any = _schema()
        owner: Any = cfg
        for part in sections:
            node = node._get_node(part) if isinstance(node, DictConfig) and not node._is_none() else None
            owner = getattr(owner, part, None)
            if node is None or not is_dataclass(owner):
                return None
        node = node._get_node(leaf) if isinstance(node, DictConfig) and not node._is_none() else None
        if not isinstance(node, ValueNode) or not hasattr(owner, leaf):
            return None
        check_override(key, value)
        try:
            converted = node.validate_and_convert(value)
        except (OmegaConfBaseException, ValueError, TypeError):
            return None
        setattr(owner, leaf, converted)
    return cfg


@functools.lru_cache(maxsize=1)
def _schema() -> DictConfig:
    """The schema's defaults as OmegaConf builds them from the dataclasses, once per process: it is
    most of the cost of a load (a sweep resolves every trial's config), and OmegaConf.merge copies
    its first config before merging into it, so the one built is never changed."""
    return OmegaConf.structured(Config)


def follow_tokenizer(cfg: Config) -> None:
    """model.vocab_size None -> the tokenizer's; a given one must equal it."""
    size = workload_paths.vocab_size(cfg.data.tokenizer)
    if cfg.model.vocab_size is None:
        cfg.model.vocab_size = size
    elif cfg.model.vocab_size != size and cfg.model.name != "linreg":
        raise ConfigError(
            "model.vocab_size",
            f"got {cfg.model.vocab_size}; the tokenizer (data.tokenizer={cfg.data.tokenizer}) has {size} tokens; "
            f"omit model.vocab_size or set it to {size}",
        )


def from_dict(data: Dict[str, Any]) -> Config:
    """A resolved config dict (as shipped to Ray workers) back into the typed schema."""
    data, ramp = _ramp_apart(data)
    try:
        cfg: Config = OmegaConf.to_object(OmegaConf.merge(_schema(), data))  # type: ignore[assignment]
    except OmegaConfBaseException as exc:
        raise _omegaconf_error(exc) from None
    cfg.batch.ramp = _ramp_steps(ramp)
    return cfg


def _interpolated_keys(node: Any, pattern: Optional[re.Pattern] = None, prefix: str = "") -> List[str]:
    """The keys whose value is an interpolation (whose text matches `pattern`, when given)."""
    keys = []
    items = node.items_ex(resolve=False) if isinstance(node, DictConfig) else enumerate(node)
    for key, _ in items:
        full = f"{prefix}{key}"
        child = node._get_node(key)
        if OmegaConf.is_config(child) and not child._is_none():  # a list or section set to None has no items
            keys += _interpolated_keys(child, pattern, full + ".")
        elif OmegaConf.is_interpolation(node, key) and (pattern is None or pattern.search(str(child._value()))):
            keys.append(full)
    return keys


def to_dict(cfg: Config, redact: bool = True) -> Dict[str, Any]:
    """Plain nested dict of the config; values read from the environment, and the password of any
    URI (`https://user:password@host`), are redacted (redact=False only for what is shipped to the
    run's own workers)."""
    # A loaded config is a plain dataclass with every value resolved: asdict gives the same keys,
    # order and types as an OmegaConf round trip without building its tree, which a sweep would
    # build several times per trial (the run's params, config.yaml, digest, worker payload).
    data = dataclasses.asdict(cfg)
    if redact:
        for key in cfg.secret_keys:
            node = data
            *parents, leaf = key.split(".")
            for part in parents:
                node = node[int(part)] if isinstance(node, list) else node[part]
            node[int(leaf) if isinstance(node, list) else leaf] = REDACTED
        data = _without_uri_passwords(data)
    return data  # type: ignore[return-value]


def redact_uri(text: str) -> str:
    """The one rule for credentials inside URIs, wherever text is logged, written or printed:
    'https://user:secret@host/x' -> 'https://user:***@host/x' (the userinfo ends at the authority's
    last '@'), a user part without a password, often a token ('https://TOKEN@host'), ->
    'https://***@host', a credential in a query string ('?token=...', '&sig=...') -> '?token=***';
    anything else as is."""

    def userinfo(m: re.Match) -> str:
        user, has_password, _ = m[1].partition(":")
        return f"://{user}:{REDACTED}@" if has_password else f"://{REDACTED}@"

    return _QUERY_SECRETS.sub(lambda m: m[1] + REDACTED, _URI_USERINFO.sub(userinfo, text))


def _without_uri_passwords(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _without_uri_passwords(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_without_uri_passwords(v) for v in node]
    return redact_uri(node) if isinstance(node, str) else node


def flatten(data: Any, prefix: str = "") -> Dict[str, Any]:
    """{"optim": {"lr": 1}} -> {"optim.lr": 1}; list items get their index."""
    out: Dict[str, Any] = {}
    items = data.items() if isinstance(data, dict) else enumerate(data)
    for key, value in items:
        name = f"{prefix}{key}"
        if isinstance(value, (dict, list)) and value:
            out.update(flatten(value, name + "."))
        else:
            out[name] = value
    return out


def from_params(params: Dict[str, Any]) -> Dict[str, Any]:
    """A run's MLflow params (the resolved config flattened by dotted key, values as text, and
    derived values beside) back into a nested config dict: only the schema's keys (a list's items
    by index, `data.sources.0.name`), each value read as YAML ('None' as null). Derived params
    that are no schema key (`train.total_steps`, `optim.beta2_effective`, ...) are left out."""
    known = set(schema_keys())
    out: Dict[str, Any] = {}
    for key in sorted(params, key=_index_order):
        parts = key.split(".")
        stem = next((i for i in range(1, len(parts) + 1) if ".".join(parts[:i]) in known), None)
        if stem is None:
            continue
        node: Any = out
        for part, following in zip(parts[:-1], parts[1:]):
            child: Any = [] if following.isdigit() else {}
            if isinstance(node, list):
                if int(part) == len(node):
                    node.append(child)
                node = node[int(part)]
            else:
                node = node.setdefault(part, child)
        value = _param_value(params[key])
        if isinstance(node, list):
            node.append(value)
        else:
            node[parts[-1]] = value
    return out


def _index_order(key: str) -> Tuple[Any, ...]:
    """Dotted keys in an order that builds lists from item 0 on (`x.10` after `x.9`)."""
    return tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in key.split("."))


def _param_value(text: Any) -> Any:
    if not isinstance(text, str):
        return text
    if text == "None":
        return None
    try:
        return yaml_files.load_text(text)
    except yaml.YAMLError:
        return text


def to_yaml(cfg: Config) -> str:
    return OmegaConf.to_yaml(OmegaConf.create(to_dict(cfg)))
