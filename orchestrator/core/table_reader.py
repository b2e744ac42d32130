"""A YAML mapping read into dataclasses by a table of rows: the sections are the dataclasses (a
field that holds one, or a list of them), every other key is checked by its row, a
validation.Field keyed by the key's dotted name (`*` for the items of a list), and read as the
row's kind the way OmegaConf reads the train config's. The sweep file is read by it
(sweep_file.load): a new section is a dataclass and its rows, not code. Pure.
"""

from __future__ import annotations

from dataclasses import Field as DataclassField
from dataclasses import fields, is_dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union, get_args, get_origin, get_type_hints

from omegaconf import FloatNode, IntegerNode, OmegaConf, StringNode
from omegaconf.errors import OmegaConfBaseException, ValidationError

from orchestrator.core.errors import ConfigError
from orchestrator.core.validation import Field

KEY = "key"
"""A dataclass field's metadata: its key in the file where that is not the field's name (`from`,
a Python word), None for what the reader of the file derives rather than reads."""
DERIVED = {KEY: None}

_NODES = {"int": IntegerNode, "float": FloatNode, "str": StringNode}


def file_key(f: DataclassField) -> Optional[str]:
    """The key of a dataclass field in the file (None: not in the file)."""
    return f.metadata.get(KEY, f.name)


def file_keys(cls: type) -> Dict[str, DataclassField]:
    """{key in the file: field} of a dataclass, in its order."""
    return {key: f for f in fields(cls) if (key := file_key(f))}


def read(
    cls: type,
    data: Mapping[str, Any],
    rows: Mapping[str, Field],
    only: Optional[Sequence[str]] = None,
    prefix: str = "",
) -> Dict[str, Any]:
    """The keyword arguments of `cls` from `data`: each key it sets, a section read in turn or a
    value checked by its row; the keys it leaves out keep their defaults. `only`: the top-level
    keys to read, the others neither read nor checked. `prefix`: where `data` sits in the file
    (`toy.` for a study's own section), in its keys and its rows' names. Every error is a one-line
    ConfigError that names the key as the file has it (`constraints.0.max`)."""
    return _section(cls, data, prefix, prefix, rows, only)


def _section(cls: type, data: Any, key: str, row: str, rows: Mapping[str, Field], only=None) -> Dict[str, Any]:
    """`key` and `row`: the dotted prefix of this mapping's keys in the file and in `rows`."""
    known = file_keys(cls)
    if data is None:  # written with nothing under it: the section's defaults
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(key.rstrip("."), f"got {data!r}; must be a mapping with keys {', '.join(known)}")
    unknown = [name for name in data if name not in known]
    if unknown and only is None:
        raise ConfigError(f"{key}{unknown[0]}", f"unknown key; valid: {', '.join(known)}")
    hints = get_type_hints(cls)
    return {
        f.name: _value(hints[f.name], data[name], key + name, row + name, rows)
        for name, f in known.items()
        if name in data and (only is None or name in only)
    }


def _value(hint: Any, value: Any, key: str, row: str, rows: Mapping[str, Field]) -> Any:
    """A section, a list of sections, or a value its row checks."""
    section, many = _section_of(hint)
    if many:
        if value is None:
            return []
        if not isinstance(value, list):
            valid = ", ".join(file_keys(section))
            raise ConfigError(key, f"got {value!r}; must be a list of mappings with keys {valid}")
        return [section(**_section(section, v, f"{key}.{i}.", f"{row}.*.", rows)) for i, v in enumerate(value)]
    if section:
        return section(**_section(section, value, key + ".", row + ".", rows))
    rule = rows[row]
    value = _as_kind(rule, key, value)
    rule.validate(key, value)
    return float(value) if rule.kind == "float" and type(value) is int else value  # checked as written


def _section_of(hint: Any) -> Tuple[Optional[type], bool]:
    """(the dataclass a field's type holds, whether a list of them); (None, False) for a value."""
    if get_origin(hint) is Union:  # Optional[X]
        hint = next(a for a in get_args(hint) if a is not type(None))
    if get_origin(hint) is list and is_dataclass(get_args(hint)[0]):
        return get_args(hint)[0], True
    return (hint, False) if is_dataclass(hint) else (None, False)


def keys(cls: type, prefix: str = "") -> List[str]:
    """Every key a file of `cls` may set, by its dotted name (`*`: the items of a list): the rows
    its table needs."""
    out: List[str] = []
    hints = get_type_hints(cls)
    for name, f in file_keys(cls).items():
        section, many = _section_of(hints[f.name])
        out += keys(section, f"{prefix}{name}{'.*' if many else ''}.") if section else [prefix + name]
    return out


def _as_kind(rule: Field, key: str, value: Any) -> Any:
    """Text read as OmegaConf reads it into a field of the rule's kind, as the train config's values
    are read: `${oc.env:X}` resolved, a number in text ('1e-3', which YAML 1.1 reads as text) a
    number; and a number given to a text field is its text. Nothing else is converted: a bool or a
    float given to an integer field, text given to a bool, or text that does not convert stays as
    written for the rule to refuse (OmegaConf would read true as 1 and 'yes' as true)."""
    node = _NODES.get(rule.kind)
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if node is None or not (isinstance(value, str) or number and rule.kind == "str"):
        return value
    try:
        return OmegaConf.to_container(OmegaConf.create({"value": node(value)}), resolve=True)["value"]
    except ValidationError:
        return value
    except OmegaConfBaseException as exc:  # an interpolation that does not resolve
        raise ConfigError(key, str(exc).splitlines()[0]) from None
