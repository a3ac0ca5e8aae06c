"""Settings trees: `--set a.b=v` parsed to the field's type, and every field of a nested config checked.

A config is a tree of frozen dataclasses. Each class may declare, beside its fields,
- `BOUNDS`: field -> "positive", "nonnegative", "fraction" (0..1), "nonpositive" or an inclusive `(low, high)`
  (either may be None); a tuple field's bound applies to each element. Floats must be finite.
- `CHOICES`: field -> the texts a field (or each element of a tuple field) may take, when it is text,
- `check(self)`: rules across fields, raising `InputError` with the field's name.
`check_tree(cfg)` applies them to every node, so a bad value is refused before anything runs; `override` parses
each value by the field's annotation, so `steps=ten` is an error, not the string "ten".
"""

from __future__ import annotations

import ast
import dataclasses
import math
import types
import typing
from typing import Any

from memllm_jax.errors import InputError

_BOUND_RULES = {
    "positive": (lambda v: v > 0, "> 0"),
    "nonnegative": (lambda v: v >= 0, ">= 0"),
    "nonpositive": (lambda v: v <= 0, "<= 0"),
    "fraction": (lambda v: 0 <= v <= 1, "in [0, 1]"),
}


def field_types(cls: type) -> dict[str, Any]:
    """A dataclass's fields with their annotations resolved (the modules use `from __future__ import annotations`)."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _arms(tp: Any) -> tuple[Any, ...]:
    """The alternatives of a union annotation (`int | None` -> (int, NoneType)); (tp,) otherwise."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return typing.get_args(tp)
    return (tp,)


def _type_name(tp: Any) -> str:
    arms = _arms(tp)
    if len(arms) > 1:
        return " or ".join(_type_name(a) for a in arms)
    if tp is type(None):
        return "None"
    if typing.get_origin(tp) is tuple:
        element = typing.get_args(tp)[0]
        plural = {int: "integers", float: "numbers", str: "texts", bool: "booleans"}.get(element, _type_name(element))
        return f"a tuple of {plural}, e.g. (1, 2)" if element in (int, float) else f"a tuple of {plural}, e.g. ('a', 'b')"
    if dataclasses.is_dataclass(tp):
        return f"a {tp.__name__} (set its fields one by one, e.g. NAME.field=value)"
    return {int: "an integer", float: "a number", bool: "true or false", str: "text"}.get(tp, getattr(tp, "__name__", str(tp)))


def _matches(value: Any, tp: Any) -> bool:
    """Whether a Python value is of the annotated type (ints count as floats; bools are not ints)."""
    for arm in _arms(tp):
        if arm is type(None) and value is None:
            return True
        if arm is bool and isinstance(value, bool):
            return True
        if arm is int and isinstance(value, int) and not isinstance(value, bool):
            return True
        if arm is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            return True
        if arm is str and isinstance(value, str):
            return True
        if typing.get_origin(arm) is tuple and isinstance(value, tuple):
            element = typing.get_args(arm)[0]
            if all(_matches(v, element) for v in value):
                return True
        if dataclasses.is_dataclass(arm) and isinstance(value, arm):
            return True
        if arm is Any:
            return True
    return False


_NO = object()


def _parse_arm(raw: str, arm: Any) -> Any:
    """`raw` as a value of one (non-union) type, or `_NO`."""
    text = raw.strip()
    if arm is type(None):
        return None if text in ("None", "none", "null") else _NO
    if arm is bool:
        return {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}.get(text.lower(), _NO)
    if arm is str:
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            return raw
        return value if isinstance(value, str) else raw
    if arm is int or arm is float:
        if arm is float and text.lower() in ("nan", "inf", "-inf", "+inf"):
            return float(text)
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            return _NO
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return _NO
        if arm is int:
            return value if isinstance(value, int) else _NO
        return float(value)
    if typing.get_origin(arm) is tuple:
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            return _NO
        if not isinstance(value, (tuple, list)):
            return _NO
        element = typing.get_args(arm)[0]
        if element is float:
            value = [float(v) if isinstance(v, int) and not isinstance(v, bool) else v for v in value]
        value = tuple(value)
        return value if all(_matches(v, element) for v in value) else _NO
    return _NO


def parse_value(raw: str, tp: Any, setting: str) -> Any:
    """`raw` (the text after `=`) as a value of annotation `tp`; an `InputError` naming `setting` otherwise."""
    arms = sorted(_arms(tp), key=lambda a: a is not type(None))  # "None" is None, not the text "None"
    for arm in arms:
        value = _parse_arm(raw, arm)
        if value is not _NO:
            return value
    raise InputError(f"setting {setting}={raw!r}: expected {_type_name(tp)}")


def override(cfg: Any, *assignments: str) -> Any:
    """`cfg` with `a.b.c=value` assignments applied, each value parsed to its field's type. An unknown field or a
    value of the wrong type is an `InputError` naming the setting."""
    for assignment in assignments:
        if "=" not in assignment:
            raise InputError(f"setting {assignment!r}: expected the form a.b=value")
        path, raw = assignment.split("=", 1)
        cfg = _replace(cfg, path.strip().split("."), raw, path.strip())
    return cfg


def _replace(node: Any, keys: list[str], raw: str, setting: str) -> Any:
    if not dataclasses.is_dataclass(node):
        raise InputError(f"setting {setting}: {'.'.join(setting.split('.')[:-len(keys)])} is not a group of settings")
    types_ = field_types(type(node))
    key = keys[0]
    if key not in types_:
        raise InputError(f"setting {setting}: {type(node).__name__} has no field {key!r} "
                         f"(fields: {', '.join(types_)})")
    if len(keys) == 1:
        return dataclasses.replace(node, **{key: parse_value(raw, types_[key], setting)})
    child = getattr(node, key)
    if child is None:  # an optional group that is off: start from its class's defaults
        classes = [a for a in _arms(types_[key]) if dataclasses.is_dataclass(a)]
        if not classes:
            raise InputError(f"setting {setting}: {key} is not a group of settings")
        child = classes[0]()
    return dataclasses.replace(node, **{key: _replace(child, keys[1:], raw, setting)})


def _bound_error(bound: Any, value: Any) -> str | None:
    """Why `value` breaks `bound`, or None."""
    if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return "must be a finite number"
    if isinstance(bound, str):
        ok, text = _BOUND_RULES[bound]
        return None if ok(value) else f"must be {text}"
    low, high = bound
    if (low is not None and value < low) or (high is not None and value > high):
        return f"must be in [{'-inf' if low is None else low}, {'inf' if high is None else high}]"
    return None


def check_tree(cfg: Any, prefix: str = "") -> None:
    """Check every field of a config tree: type, bound, choice, then each node's `check()`; an `InputError` naming
    the first bad setting as `a.b.c=value`."""
    cls = type(cfg)
    bounds, choices = getattr(cls, "BOUNDS", {}), getattr(cls, "CHOICES", {})
    for name, tp in field_types(cls).items():
        value, setting = getattr(cfg, name), f"{prefix}{name}"
        if not _matches(value, tp):
            raise InputError(f"setting {setting}={value!r}: expected {_type_name(tp)}")
        elements = value if isinstance(value, tuple) else (value,)
        for element in elements:
            if isinstance(element, float) and not math.isfinite(element):
                raise InputError(f"setting {setting}={value!r}: must be a finite number")
            if name in bounds and (why := _bound_error(bounds[name], element)):
                raise InputError(f"setting {setting}={value!r}: {why}")
            if name in choices and isinstance(element, str) and element not in choices[name]:
                raise InputError(f"setting {setting}={value!r}: must be one of {', '.join(map(repr, choices[name]))}")
        if dataclasses.is_dataclass(value):
            check_tree(value, f"{setting}.")
    if hasattr(cfg, "check"):
        try:
            cfg.check()
        except InputError as exc:
            raise InputError(f"setting {prefix}{exc}" if not str(exc).startswith("setting ") else str(exc)) from None


def leaf_settings(cfg: Any, prefix: str = "") -> dict[str, Any]:
    """Every leaf setting of a tree as `a.b.c` -> annotation (for listings and tests)."""
    out: dict[str, Any] = {}
    for name, tp in field_types(type(cfg)).items():
        value = getattr(cfg, name)
        if dataclasses.is_dataclass(value):
            out.update(leaf_settings(value, f"{prefix}{name}."))
        else:
            out[f"{prefix}{name}"] = tp
    return out



def replace(cfg: Any, changes: dict[str, Any]) -> Any:
    """`cfg` with `{"a.b.c": value}` set (Python values; `check_tree` checks them), e.g. an experiment config's
    variation of the default: `replace(PipelineConfig(), {"data.eval_docs": 50, "mw.steps": 300})`."""
    for path, value in changes.items():
        cfg = _set(cfg, path.split("."), value, path)
    return cfg


def _set(node: Any, keys: list[str], value: Any, setting: str) -> Any:
    if not dataclasses.is_dataclass(node) or keys[0] not in {f.name for f in dataclasses.fields(node)}:
        raise InputError(f"setting {setting}: {type(node).__name__} has no field {keys[0]!r}")
    if len(keys) == 1:
        return dataclasses.replace(node, **{keys[0]: value})
    return dataclasses.replace(node, **{keys[0]: _set(getattr(node, keys[0]), keys[1:], value, setting)})
