"""Config dataclass fields that own their default, help text and allowed values.

A config declares each field once with :func:`option`; validation (one line naming every bad
field, at construction), argparse flags (``add_arguments`` / ``from_args``) and JSON
(``to_dict`` / ``from_dict``) are derived from it. Why not tyro, jsonargparse or simple-parsing:
they derive flag names and help from types, and the CLI's flags are a public interface; the small
shared part is easier to read than to configure. "Off" is the string ``"off"`` (:data:`OFF`),
never ``None``, which means "not given, derive it" where a field says so."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable, Iterable, Sequence
from difflib import get_close_matches
from typing import Any

from schemas.errors import MmlinksError

OFF = "off"
_KEY = "mmlinks.option"
_SIMPLE_TYPES: dict[str, Callable[[str], Any]] = {"int": int, "float": float, "str": str}


@dataclasses.dataclass(frozen=True)
class FieldInfo:
    """What a config field says about itself (kept in ``dataclasses.Field.metadata``)."""

    help: str
    choices: tuple | Callable[[], Sequence] | None = None  # a callable reads a registry lazily
    flag: str | None = None  # CLI flag; None: --name-with-dashes; "": no CLI flag
    parse: Callable[[str], Any] | None = None  # CLI text -> value (default: from the field type)
    check: Callable[[Any], bool] | None = None  # a rule beyond choices
    rule: str = ""  # the rule in words, for error messages
    metavar: str | None = None
    group: str = ""  # argparse group title for the CLI
    secret: bool = False  # never logged (hosts, storage URIs with keys)
    cli_choices: bool = True  # False: choices shown in --help, but refused by validation's wording

    def allowed(self) -> tuple:
        if self.choices is None:
            return ()
        return tuple(self.choices() if callable(self.choices) else self.choices)


def option(
    default: Any = dataclasses.MISSING,
    *,
    help: str,
    choices: tuple | Callable[[], Sequence] | None = None,
    flag: str | None = None,
    parse: Callable[[str], Any] | None = None,
    check: Callable[[Any], bool] | None = None,
    rule: str = "",
    metavar: str | None = None,
    group: str = "",
    secret: bool = False,
    cli_choices: bool = True,
    default_factory: Callable[[], Any] | Any = dataclasses.MISSING,
    at_least: float | None = None,
    within: tuple[float, float] | None = None,
) -> Any:
    """A dataclass field carrying its help, allowed values and CLI spelling. ``at_least=N`` and
    ``within=(LO, HI)`` are the common rules, each a ``check`` and its ``rule`` said once; a field
    whose default is None (unset: the code decides) takes None under ``at_least`` too."""
    if at_least is not None:
        unset_ok = default is None
        check, rule = (lambda v: (unset_ok and v is None) or v >= at_least), f">= {at_least}"
    if within is not None:
        check, rule = (lambda v: within[0] <= v <= within[1]), f"in [{within[0]}, {within[1]}]"
    info = FieldInfo(help, choices, flag, parse, check, rule, metavar, group, secret, cli_choices)
    if default_factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=default_factory, metadata={_KEY: info})
    return dataclasses.field(default=default, metadata={_KEY: info})


def field_info(f: dataclasses.Field) -> FieldInfo | None:
    return f.metadata.get(_KEY)


def options_of(cls_or_obj) -> dict[str, tuple[dataclasses.Field, FieldInfo]]:
    """``{name: (field, info)}`` for every field declared with :func:`option`, in order."""
    out = {}
    for f in dataclasses.fields(cls_or_obj):
        info = field_info(f)
        if info is not None:
            out[f.name] = (f, info)
    return out


def default_of(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def default_value(cls, name: str) -> Any:
    """The declared default of one field, for a command that takes the same setting under its
    own flag (``mmlinks evaluate --pool-size``) without writing the default a second time."""
    return default_of(options_of(cls)[name][0])


def problems(obj) -> list[str]:
    """Every field of ``obj`` whose value breaks its choices or rule, as ``name (what is allowed)``."""
    bad = []
    for name, (_, info) in options_of(obj).items():
        value = getattr(obj, name)
        allowed = info.allowed()
        if allowed and value not in allowed:
            shown = ", ".join(str(a) for a in allowed if a is not None)
            bad.append(f"{name} {value!r} ({info.rule or 'one of'} {shown})")
        elif info.check is not None:
            try:
                ok = info.check(value)
            except (TypeError, ValueError):
                ok = False
            if not ok:
                bad.append(f"{name} {value!r} ({info.rule or 'invalid'})")
    return bad


def validate(obj, what: str | None = None) -> None:
    """Raise one ``MmlinksError`` naming every bad field of ``obj``."""
    bad = problems(obj)
    if bad:
        raise MmlinksError(f"invalid {what or _what(obj)}: {'; '.join(bad)}")


def _what(obj) -> str:
    name = type(obj).__name__
    return {"TrainConfig": "training config", "BuildConfig": "build config"}.get(name, name)


def public_dict(obj) -> dict:
    """The config as a dict, minus fields marked secret (for params, artifacts, logs)."""
    secret = {name for name, (_, info) in options_of(obj).items() if info.secret}
    return {k: v for k, v in dataclasses.asdict(obj).items() if k not in secret}


def refuse_unknown(
    cls,
    data: dict,
    *,
    what: str | None = None,
    ignore: Iterable[str] = (),
    show_known: bool = True,
    note: str = "",
) -> None:
    """Refuse keys of ``data`` that are not fields of ``cls``, by name, with the closest field
    as a hint (a typo is an error, not a silent default); ``note`` ends the message."""
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names - set(ignore))
    if unknown:
        hinted = [
            f"{k} (did you mean {m[0]}?)" if (m := get_close_matches(k, names, 1)) else k for k in unknown
        ]
        known = f"; known: {', '.join(sorted(names))}" if show_known else ""
        why = f" ({note})" if note else ""
        raise MmlinksError(f"unknown {what or cls.__name__} field(s) {', '.join(hinted)}{known}{why}")


def from_dict(cls, data: dict, *, what: str | None = None, ignore: Iterable[str] = ()):
    """``cls(**data)`` refusing unknown keys by name (``refuse_unknown``)."""
    refuse_unknown(cls, data, what=what, ignore=ignore)
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in data.items() if k in names})


# ---------------------------------------------------------------------------------- argparse


def flag_of(name: str, info: FieldInfo) -> str:
    return info.flag if info.flag else "--" + name.replace("_", "-")


def _shown(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    if value in ("", None):
        return "none"
    return str(value)


def _type_name(f: dataclasses.Field) -> str:
    """``"int"``, ``"int | None"``...: annotations are strings under postponed evaluation."""
    return f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))


def _parser_type(f: dataclasses.Field, info: FieldInfo) -> Callable[[str], Any] | None:
    if info.parse is not None:
        return _one_line(info.parse, f.name)
    return _SIMPLE_TYPES.get(_type_name(f).removesuffix(" | None"))  # None: the "not given" default


def _one_line(parse: Callable[[str], Any], name: str) -> Callable[[str], Any]:
    """argparse shows ``invalid <fn> value``; a parse error should say what the field wants."""

    def wrapped(text: str) -> Any:
        try:
            return parse(text)
        except MmlinksError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    wrapped.__name__ = name
    return wrapped


def add_arguments(
    parser: argparse.ArgumentParser,
    cls,
    names: Iterable[str] | None = None,
    *,
    defaults: dict[str, Any] | None = None,
    exclude: Iterable[str] = (),
    groups: bool = True,
    note: dict[str, str] | None = None,
) -> None:
    """One option per field of ``cls`` (all ``option`` fields, or ``names`` in that order).

    ``defaults`` are the command's own defaults (the demo trains 20 epochs, not 50): shown in
    the help and applied when the flag is absent. Fields absent from the namespace keep the
    dataclass default in :func:`from_args`, so no default is written twice.
    """
    table = options_of(cls)
    chosen = list(names) if names is not None else [n for n in table if n not in set(exclude)]
    defaults = defaults or {}
    note = note or {}
    group_of: dict[str, Any] = {}
    for name in chosen:
        f, info = table[name]
        if info.flag == "":
            continue
        target = parser
        if groups and info.group:
            if info.group not in group_of:
                group_of[info.group] = parser.add_argument_group(info.group)
            target = group_of[info.group]
        default = defaults.get(name, default_of(f))
        text = info.help + note.get(name, "")
        kwargs: dict[str, Any] = {"dest": name, "default": argparse.SUPPRESS}
        if name in defaults:
            kwargs["default"] = defaults[name]
        elif default is dataclasses.MISSING:
            kwargs["required"] = True
        if _type_name(f) == "bool":
            kwargs["action"] = "store_true"
        else:
            kind = _parser_type(f, info)
            if kind is not None:
                kwargs["type"] = kind
            allowed = [a for a in info.allowed() if a is not None]  # None: "not given", no CLI word
            if allowed and info.cli_choices:
                kwargs["choices"] = allowed
            elif allowed and not all(str(a) in text for a in allowed):
                text += f" ({', '.join(map(str, allowed))})"
            if info.metavar or not allowed:
                kwargs["metavar"] = info.metavar or flag_of(name, info).lstrip("-").replace("-", "_").upper()
            if default is not dataclasses.MISSING and "(default" not in text:
                text += f" (default: {_shown(default)})"
        kwargs["help"] = text
        target.add_argument(flag_of(name, info), **kwargs)


def given(args: argparse.Namespace, cls) -> dict[str, Any]:
    """The fields of ``cls`` present in ``args`` (given by the user or by the command's defaults)."""
    return {name: getattr(args, name) for name in options_of(cls) if hasattr(args, name)}


def from_args(cls, args: argparse.Namespace, **fixed):
    """``cls`` from the namespace's fields of ``cls`` (plus ``fixed``); validated on creation."""
    return cls(**{**given(args, cls), **fixed})


# ---------------------------------------------------------------------------------- parsers


def int_or_off(lo: int, hi: int) -> Callable[[str], int | str]:
    """Parse a number in [lo, hi] or the word ``off``."""

    def parse(text: str) -> int | str:
        if str(text).strip().lower() == OFF:
            return OFF
        try:
            value = int(text)
        except ValueError:
            raise MmlinksError(f"wants a number from {lo} to {hi} or 'off', not {text!r}") from None
        if not lo <= value <= hi:
            raise MmlinksError(f"wants a number from {lo} to {hi} or 'off', not {text!r}")
        return value

    return parse


def is_int_or_off(lo: int, hi: int) -> Callable[[Any], bool]:
    return lambda v: v == OFF or (isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi)
