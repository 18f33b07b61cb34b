"""Run configurations: a settings dataclass, read from a YAML or TOML file, overridden by flags.

A run's settings are a dataclass whose fields carry their help as attribute docstrings
(:func:`field_docs`); a section is a nested dataclass (``GRPOConfig.train:
TrainConfig`` is the ``train:`` mapping of a file and the ``--train.lr`` flag)::

    parser = argparse.ArgumentParser()
    parser.add_argument("--config")
    add_dataclass_arguments(parser, GRPOConfig)      # --steps, --train.lr …, help = docstrings
    args = parser.parse_args()
    config = resolve(GRPOConfig, file=args.config, args=args)   # defaults < file < flags
    dump(config, output_dir / "config.yaml")                    # what the run really used

The rules, the same for every source:

* a key that is not a field is refused, naming the file, the key path (``train.lrr``), the
  valid keys there and the closest one;
* a value is checked against the field's type and converted where the intent is plain: a string
  is parsed as a number or a boolean (YAML reads ``5e-4`` as a string), an integer is a float, a
  float with no fraction is an integer, a list is a tuple. A value that does not fit names the key,
  the expected type and the value (a string field does not take a number: quote it);
* on the command line (text) also: ``none``/``null`` is None for a field that may be None, a
  sequence is ``a,b,c`` or ``[a, b]``, a mapping is ``{key: value}`` (YAML or JSON), a boolean
  field is ``--flag`` / ``--no-flag``;
* a union (``str | CreditRule``, ``float | None``) takes the first member that fits, a value of
  exactly a member's type first; from text, every member that is not a string is tried before
  a string member.

Errors are :class:`ConfigError`, an :class:`~agentgrad.errors.InvalidInputError`: nothing starts.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import difflib
import enum
import inspect
import json
import os
import textwrap
import types
import typing
from collections.abc import Collection, Iterator, Mapping, Sequence
from pathlib import Path, PurePath
from typing import Any, Literal, TypeVar, Union, get_args, get_origin

from agentgrad.errors import InvalidInputError

__all__ = [
    "ConfigError",
    "ConfigField",
    "add_dataclass_arguments",
    "config_fields",
    "dump",
    "field_docs",
    "from_dict",
    "load_file",
    "markdown_reference",
    "resolve",
    "to_dict",
]

T = TypeVar("T")

#: Config file formats by extension.
FILE_FORMATS = {".yaml": "yaml", ".yml": "yaml", ".toml": "toml", ".json": "json"}

_TRUE = {"true", "yes", "on", "1", "y", "t"}
_FALSE = {"false", "no", "off", "0", "n", "f"}
_NULL = {"none", "null", "~"}


class ConfigError(InvalidInputError):
    """A config file or flag that cannot be used; ``source`` is the file (or ``flags``), ``key``
    the dotted key path, when known."""

    def __init__(self, message: str, *, source: str | None = None, key: str | None = None) -> None:
        super().__init__(message)
        self.source, self.key = source, key


@dataclasses.dataclass(frozen=True)
class ConfigField:
    """One setting of a config class, sections flattened: ``train.lr``."""

    path: str
    """Dotted key path: the key in a file's nested mappings and the flag ``--path``."""
    type: Any
    """The field's resolved annotation."""
    default: Any
    """The default, as the class (and the defaults of the sections above it) give it;
    ``dataclasses.MISSING`` when the field is required."""
    doc: str
    """The field's help (its attribute docstring), ``""`` when it has none."""
    section: bool = False
    """A section that may be None (``lora: LoraSettings | None``): set whole by ``--train.lora none``
    or ``--train.lora '{r: 8}'``; its settings follow it as their own entries."""


# ---- reading a class -------------------------------------------------------------------------------


def _check_class(cls: Any) -> None:
    if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
        raise TypeError(f"expected a dataclass, got {cls!r}")


def _fields(cls: type) -> list[dataclasses.Field[Any]]:
    return [f for f in dataclasses.fields(cls) if f.init]


def _hints(cls: type) -> dict[str, Any]:
    try:
        return typing.get_type_hints(cls)
    except Exception as exc:  # a name the annotations use but the module does not define at run time
        raise TypeError(f"cannot resolve the annotations of {cls.__qualname__}: {exc}") from exc


def _docs(cls: type) -> dict[str, str]:
    try:
        return field_docs(cls)
    except TypeError:  # no source to read (a class made at run time): no help, still usable
        return {}


def _section(tp: Any) -> type | None:
    """The dataclass a field's type is a section of: ``Train`` or ``Train | None``."""
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return tp
    if _is_union(tp):
        members = [a for a in get_args(tp) if a is not type(None)]
        if len(members) == 1 and isinstance(members[0], type) and dataclasses.is_dataclass(members[0]):
            return members[0]
    return None


def _default_of(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def config_fields(cls: type) -> list[ConfigField]:
    """Every setting of ``cls``, sections flattened in definition order (``steps``, ``train.lr``…)."""
    _check_class(cls)
    return list(_walk(cls, "", dataclasses.MISSING))


def _walk(cls: type, prefix: str, base: Any) -> Iterator[ConfigField]:
    hints, docs = _hints(cls), _docs(cls)
    for f in _fields(cls):
        default = getattr(base, f.name) if isinstance(base, cls) else _default_of(f)
        section = _section(hints[f.name])
        if section is not None:
            if _is_union(hints[f.name]):  # may be None: the section itself is a setting too
                yield ConfigField(prefix + f.name, hints[f.name], default, docs.get(f.name, ""), section=True)
            yield from _walk(section, f"{prefix}{f.name}.", default)
        else:
            yield ConfigField(prefix + f.name, hints[f.name], default, docs.get(f.name, ""))


def _field_type(cls: type, path: Sequence[str]) -> Any:
    """The type of the field at ``path`` (names), or KeyError naming the first unknown part."""
    tp: Any = cls
    for depth, name in enumerate(path):
        section = _section(tp)
        if section is None or name not in {f.name for f in _fields(section)}:
            raise KeyError(depth)
        tp = _hints(section)[name]
    return tp


# ---- values --------------------------------------------------------------------------------------


class _Mismatch(Exception):
    """A value that does not fit a type (the caller names the key and the source)."""


def _is_union(tp: Any) -> bool:
    return get_origin(tp) in (Union, types.UnionType)


def describe(tp: Any) -> str:
    """A type as an error message or ``--help`` names it: ``a number``, ``one of 'std', 'mean'``."""
    if tp is Any or tp is object:
        return "any value"
    if tp is type(None):
        return "null"
    if _is_union(tp):
        return " or ".join(describe(a) for a in get_args(tp))
    origin, args = get_origin(tp), get_args(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    if origin in (tuple, list, Sequence) or tp in (tuple, list):
        if origin is tuple and args and args[-1] is not Ellipsis:
            return f"a list of {len(args)} ({', '.join(describe(a) for a in args)})"
        return f"a list, each item {describe(args[0])}" if args else "a list"
    if origin in (dict, Mapping) or tp is dict:
        return "a mapping"
    if isinstance(tp, type):
        if issubclass(tp, bool):
            return "true or false"
        if issubclass(tp, int):
            return "an integer"
        if issubclass(tp, float):
            return "a number"
        if issubclass(tp, str):
            return "a string"
        if issubclass(tp, PurePath):
            return "a path"
        if issubclass(tp, enum.Enum):
            return "one of " + ", ".join(repr(m.value) for m in tp)
        if dataclasses.is_dataclass(tp):
            return f"{_a(tp.__name__)} section (a mapping)"
        return _a(tp.__qualname__)
    return str(tp)


def _a(noun: str) -> str:
    return f"{'an' if noun[:1].lower() in 'aeiou' else 'a'} {noun}"


def _parse_text(text: str) -> Any:
    """``[a, b]`` or ``{k: v}`` written on the command line: YAML flow syntax (JSON is a part of it)."""
    try:
        import yaml
    except ImportError:
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise _Mismatch from exc
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise _Mismatch from exc


def _is_texty(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, (str, PurePath))


def _exact(value: Any, tp: Any) -> bool:
    """``value`` is already of type ``tp`` (no conversion): the first pass over a union's members."""
    if tp is type(None):
        return value is None
    if get_origin(tp) is Literal:
        return any(value == a and type(value) is type(a) for a in get_args(tp))
    if not isinstance(tp, type) or get_origin(tp) is not None:
        return False
    if tp is int:
        return type(value) is int
    if tp is float:
        return type(value) is float
    if dataclasses.is_dataclass(tp) or tp in (bool, str) or issubclass(tp, (PurePath, enum.Enum)):
        return isinstance(value, tp)
    return False


def _convert(value: Any, tp: Any, text: bool) -> Any:
    """``value`` as type ``tp``, or :class:`_Mismatch`. ``text``: it came from the command line."""
    if tp is Any or tp is object:
        return value
    if tp is type(None):
        if value is None or (text and isinstance(value, str) and value.strip().lower() in _NULL):
            return None
        raise _Mismatch
    origin, args = get_origin(tp), get_args(tp)
    if _is_union(tp):
        if not text:
            for member in args:
                if _exact(value, member):
                    return _convert(value, member, text)
        ordered = [a for a in args if not _is_texty(a)] + [a for a in args if _is_texty(a)] if text else list(args)
        for member in ordered:
            try:
                return _convert(value, member, text and _section(member) is None)
            except _Mismatch:
                continue
        raise _Mismatch
    if origin is Literal:
        for choice in args:
            if value == choice and type(value) is type(choice):
                return choice
            if isinstance(value, str) and not isinstance(choice, str):
                try:
                    if _convert(value, type(choice), text) == choice:
                        return choice
                except _Mismatch:
                    pass
        raise _Mismatch
    if origin in (tuple, list, Sequence) or tp in (tuple, list):
        if isinstance(value, str) and text:
            stripped = value.strip()
            if stripped.startswith("["):
                value = _parse_text(stripped)
            elif stripped == "":
                value = []
            else:
                value = [part.strip() for part in stripped.split(",")]
        if not isinstance(value, (list, tuple)):
            raise _Mismatch
        if origin is tuple and args and args[-1] is not Ellipsis:
            if len(value) != len(args):
                raise _Mismatch
            return tuple(_convert(v, a, text) for v, a in zip(value, args, strict=True))
        item = args[0] if args else Any
        items = [_convert(v, item, text) for v in value]
        return tuple(items) if origin is tuple or tp is tuple else items
    if origin in (dict, Mapping) or tp is dict:
        if isinstance(value, str) and text:
            value = _parse_text(value) if value.strip() else {}
        if not isinstance(value, Mapping):
            raise _Mismatch
        key_type, value_type = args if args else (Any, Any)
        return {_convert(k, key_type, False): _convert(v, value_type, text) for k, v in value.items()}
    if not isinstance(tp, type):
        raise _Mismatch  # an annotation this module does not know: say so rather than guess
    if issubclass(tp, bool):
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
            return value.strip().lower() in _TRUE
        raise _Mismatch
    if issubclass(tp, int):
        if isinstance(value, bool):
            raise _Mismatch
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            try:
                return int(value.strip())
            except ValueError:
                try:
                    number = float(value.strip())
                except ValueError:
                    raise _Mismatch from None
                if number.is_integer():
                    return int(number)
        raise _Mismatch
    if issubclass(tp, float):
        if isinstance(value, bool):
            raise _Mismatch
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value.strip())
            except ValueError:
                raise _Mismatch from None
        raise _Mismatch
    if issubclass(tp, str):
        if isinstance(value, str):
            return value
        raise _Mismatch
    if issubclass(tp, PurePath):
        if isinstance(value, (str, os.PathLike)):
            return tp(value)
        raise _Mismatch
    if issubclass(tp, enum.Enum):
        if isinstance(value, tp):
            return value
        for member in tp:
            if value == member.value or (isinstance(value, str) and value in (member.name, str(member.value))):
                return member
        raise _Mismatch
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if isinstance(value, Mapping):
            try:
                return from_dict(tp, value)
            except ConfigError as exc:
                raise _Mismatch(str(exc)) from None
        raise _Mismatch
    try:
        if isinstance(value, tp):
            return value
    except TypeError:  # a Protocol that is not runtime-checkable
        pass
    raise _Mismatch


def _coerce(value: Any, tp: Any, *, source: str, key: str, text: bool) -> Any:
    try:
        return _convert(value, tp, text)
    except _Mismatch as exc:
        why = f" ({exc})" if str(exc) else ""
        hint = ""
        wants_text = _is_texty(tp) or (_is_union(tp) and all(_is_texty(a) or a is type(None) for a in get_args(tp)))
        if wants_text and isinstance(value, (int, float, bool)) and not text:
            hint = " (quote it to make it a string)"
        raise ConfigError(
            f"{source}: {key}: expected {describe(tp)}, got {value!r}{why}{hint}", source=source, key=key
        ) from None


# ---- mappings → instances --------------------------------------------------------------------------


def _unknown_key(cls: type, path: tuple[str, ...], key: Any, source: str, flag: bool) -> ConfigError:
    names = [f.name for f in _fields(cls)]
    dotted = ".".join((*path, str(key)))
    shown = "--" + _flag_name(dotted) if flag else dotted
    close = difflib.get_close_matches(str(key), names, n=1)
    where = f" under {'.'.join(path)}" if path else ""
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return ConfigError(
        f"{source}: unknown key {shown!r}{hint} (valid keys{where}: {', '.join(names)})", source=source, key=dotted
    )


def _validate(
    cls: type, data: Any, *, source: str, path: tuple[str, ...] = (), text: bool = False, flag: bool = False
) -> dict[str, Any]:
    """Check and convert a (nested) mapping against ``cls``: a mapping of converted values, with
    sections still mappings (so that a later source can set single keys inside them)."""
    dotted = ".".join(path)
    if not isinstance(data, Mapping):
        where = f"{dotted}: " if path else ""
        raise ConfigError(
            f"{source}: {where}expected a mapping of {cls.__name__} settings, got {data!r}",
            source=source,
            key=dotted or None,
        )
    hints = _hints(cls)
    names = {f.name for f in _fields(cls)}
    out: dict[str, Any] = {}
    for key, value in data.items():
        if key not in names:
            raise _unknown_key(cls, path, key, source, flag)
        tp = hints[key]
        section = _section(tp)
        if section is not None and isinstance(value, Mapping):
            out[key] = _validate(section, value, source=source, path=(*path, key), text=text, flag=flag)
        else:
            key_path = ".".join((*path, key))
            out[key] = _coerce(
                value, tp, source=source, key="--" + _flag_name(key_path) if flag else key_path, text=text
            )
    return out


def _merge(cls: type, base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """Validated ``over`` on validated ``base``: a section given in both is merged key by key; any
    other value (a mapping-valued setting such as ``sampling`` too) is replaced whole."""
    merged = dict(base)
    hints = _hints(cls)
    for key, value in over.items():
        section = _section(hints[key])
        if section is not None and isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(section, merged[key], value)
        else:
            merged[key] = value
    return merged


def _build(cls: type[T], values: Mapping[str, Any], base: Any, source: str, path: tuple[str, ...] = ()) -> T:
    """An instance of ``cls`` from validated ``values`` over ``base`` (an instance) or the defaults."""
    hints = _hints(cls)
    kwargs: dict[str, Any] = {}
    for f in _fields(cls):
        if f.name not in values:
            continue
        value = values[f.name]
        section = _section(hints[f.name])
        if section is not None and isinstance(value, dict):
            sub_base = getattr(base, f.name) if base is not None else _default_of(f)
            value = _build(section, value, sub_base if isinstance(sub_base, section) else None, source, (*path, f.name))
        kwargs[f.name] = value
    missing = [
        f.name
        for f in _fields(cls)
        if f.name not in kwargs
        and base is None
        and f.default is dataclasses.MISSING
        and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        shown = ", ".join(".".join((*path, name)) for name in missing)
        raise ConfigError(
            f"{source}: missing required setting(s) {shown}", source=source, key=".".join((*path, missing[0]))
        )
    try:
        return dataclasses.replace(base, **kwargs) if base is not None else cls(**kwargs)
    except ValueError as exc:  # the class's own checks (__post_init__)
        where = f" ({'.'.join(path)})" if path else ""
        raise ConfigError(f"{source}{where}: {exc}", source=source) from None


def from_dict(cls: type[T], data: Mapping[str, Any], *, source: str = "settings") -> T:
    """An instance of ``cls`` from a nested mapping, checked and converted as a config file is."""
    _check_class(cls)
    return _build(cls, _validate(cls, data, source=source), None, source)


# ---- files ---------------------------------------------------------------------------------------


def _yaml_loader() -> Any:
    import yaml

    class Loader(yaml.SafeLoader):
        """Safe YAML that refuses a key given twice (PyYAML would keep the last one silently)."""

    def construct_mapping(loader: Any, node: Any, deep: bool = False) -> Any:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = loader.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"key {key!r} given twice", key_node.start_mark)
            seen.add(key)
        return loader.construct_mapping(node, deep=deep)

    Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, construct_mapping)
    return Loader


def load_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The mapping in a config file: YAML (``.yaml``, ``.yml``), TOML (``.toml``) or JSON (``.json``).

    An empty YAML file is an empty mapping. Errors name the file (and line, where the parser says).
    """
    shown = str(path)
    kind = FILE_FORMATS.get(Path(path).suffix.lower())
    if kind is None:
        raise ConfigError(f"config file {shown}: unknown format (use .yaml, .yml, .toml or .json)", source=shown)
    try:
        text = Path(path).read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as exc:
        reason = getattr(exc, "strerror", None) or exc
        raise ConfigError(f"cannot read config file {shown}: {reason}", source=shown) from None
    data: Any
    if kind == "yaml":
        try:
            import yaml
        except ImportError:
            raise ConfigError(
                f"reading {shown} needs PyYAML: pip install pyyaml (or use a .toml file)", source=shown
            ) from None
        try:
            data = yaml.load(text, Loader=_yaml_loader())  # a SafeLoader subclass: safe
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            line = f":{mark.line + 1}" if mark is not None else ""
            problem = getattr(exc, "problem", None) or exc
            raise ConfigError(f"{shown}{line}: not YAML ({problem})", source=shown) from None
    elif kind == "toml":
        import tomllib

        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{shown}: not TOML ({exc})", source=shown) from None
    else:
        try:
            data = json.loads(text) if text.strip() else {}
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{shown}:{exc.lineno}: not JSON ({exc.msg})", source=shown) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"{shown}: a config file holds a mapping of settings, got {type(data).__name__}", source=shown
        )
    return data


# ---- flags ---------------------------------------------------------------------------------------


def _flag_name(dotted: str) -> str:
    return dotted.replace("_", "-")


def _show(value: Any) -> str:
    """A default as ``--help`` shows it (what one would type)."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return ",".join(_show(v) for v in value) if value else "[]"
    if isinstance(value, enum.Enum):
        return str(value.value)
    if isinstance(value, Mapping):
        return json.dumps(to_dict(value))
    if isinstance(value, str) and value == "":
        return '""'
    return str(value)


def _metavar(tp: Any) -> str:
    if _is_union(tp):
        members = [a for a in get_args(tp) if a is not type(None)]
        if len(members) == 1:
            return _metavar(members[0])
        return "TEXT" if any(_is_texty(a) for a in members) else "VALUE"
    origin, args = get_origin(tp), get_args(tp)
    if origin is Literal:
        return "{" + ",".join(str(a) for a in args) + "}"
    if origin in (tuple, list, Sequence) or tp in (tuple, list):
        return "A,B,..."
    if origin in (dict, Mapping) or tp is dict:
        return "{K: V}"
    if isinstance(tp, type):
        if issubclass(tp, enum.Enum):
            return "{" + ",".join(str(m.value) for m in tp) + "}"
        for kind, name in ((int, "INT"), (float, "FLOAT"), (str, "TEXT"), (PurePath, "PATH")):
            if issubclass(tp, kind):
                return name
    return "VALUE"


def _is_bool(tp: Any) -> bool:
    members = [a for a in get_args(tp) if a is not type(None)] if _is_union(tp) else [tp]
    return members == [bool]


def _help(doc: str, default: Any) -> str:
    first = doc.split("\n\n")[0]
    text = " ".join(first.split())
    shown = "required" if default is dataclasses.MISSING else f"default: {_show(default)}"
    return f"{text} ({shown})".replace("%", "%%") if text else f"({shown})".replace("%", "%%")


def add_dataclass_arguments(
    parser: argparse.ArgumentParser | Any, cls: type, prefix: str = "", skip: Collection[str] = ()
) -> None:
    """One ``--flag`` per setting of ``cls``: ``--steps``, ``--train.lr`` (sections), with the
    field's docstring and default as help. ``prefix`` (e.g. ``"grpo."``) goes before every flag.
    ``skip`` names top-level fields whose flags another class of the same parser already added
    (two config classes can share flags: the one given sets the field of whichever is resolved).

    Names are written with dashes (``--group-size``; ``--group_size`` is accepted too). A flag that
    is not given leaves no attribute on the namespace, so :func:`resolve` can tell it from a default;
    values are checked as they are parsed (a bad one is a usage error naming the flag).
    """
    _check_class(cls)
    is_parser = isinstance(parser, argparse.ArgumentParser)
    groups: dict[str, Any] = {}
    for setting in config_fields(cls):
        if setting.path.partition(".")[0] in skip:
            continue
        section = setting.path.rpartition(".")[0]
        if is_parser and section not in groups:
            title = f"{cls.__name__} settings" if not section else f"{cls.__name__} settings: {section}"
            groups[section] = parser.add_argument_group(title)
        target = groups[section] if is_parser else parser
        dest = prefix + setting.path
        flag = "--" + _flag_name(prefix + setting.path)
        alias = "--" + prefix + setting.path
        options: dict[str, Any] = {"dest": dest, "default": argparse.SUPPRESS}
        if _is_bool(setting.type):
            options["action"] = argparse.BooleanOptionalAction
        elif setting.section:
            options["type"] = _section_converter(setting.type)
            options["metavar"] = "none|{K: V}"
        else:
            options["type"] = _flag_converter(setting.type)
            options["metavar"] = _metavar(setting.type)
        target.add_argument(flag, help=_help(setting.doc, setting.default), **options)
        if alias != flag:
            target.add_argument(alias, help=argparse.SUPPRESS, **options)


def _flag_converter(tp: Any) -> Any:
    def convert(text: str) -> Any:
        try:
            return _convert(text, tp, True)
        except _Mismatch:
            raise argparse.ArgumentTypeError(f"expected {describe(tp)}, got {text!r}") from None

    convert.__name__ = describe(tp)
    return convert


def _section_converter(tp: Any) -> Any:
    def convert(text: str) -> Any:
        if text.strip().lower() in _NULL:
            return None
        try:
            value = _parse_text(text)
        except _Mismatch:
            value = None
        if not isinstance(value, Mapping):
            raise argparse.ArgumentTypeError(f"expected none or a mapping such as '{{key: value}}', got {text!r}")
        return dict(value)

    convert.__name__ = describe(tp)
    return convert


def _flag_values(cls: type, args: argparse.Namespace | Mapping[str, Any], prefix: str) -> dict[str, Any]:
    """The flags that were given, as a nested mapping (``train.lr`` → ``{"train": {"lr": …}}``)."""
    if isinstance(args, argparse.Namespace):
        given = vars(args)
        paths = {prefix + s.path: s.path for s in config_fields(cls)}
        flat = {paths[key]: value for key, value in given.items() if key in paths}
    else:
        flat = {key[len(prefix) :] if prefix and key.startswith(prefix) else key: value for key, value in args.items()}
    nested: dict[str, Any] = {}
    # a section set whole first (--train.lora '{r: 8}'), then the keys inside it (--train.lora.alpha 16)
    for dotted, value in sorted(flat.items(), key=lambda item: item[0].count(".")):
        parts = dotted.split(".")
        try:
            _field_type(cls, parts)
        except KeyError as exc:
            depth = exc.args[0]
            owner = _section(_field_type(cls, parts[:depth]))
            if owner is None:
                shown = "--" + _flag_name(".".join(parts[:depth]))
                raise ConfigError(
                    f"flags: {shown} is a setting, not a section: --{_flag_name(dotted)} names nothing",
                    source="flags",
                    key=dotted,
                ) from None
            raise _unknown_key(owner, tuple(parts[:depth]), parts[depth], "flags", True) from None
        node = nested
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):  # --train.lora none, then --train.lora.r 8
                raise ConfigError(
                    f"flags: --{_flag_name(dotted)} sets a key inside {part}, which was set whole",
                    source="flags",
                    key=dotted,
                )
        node[parts[-1]] = value
    return nested


def resolve(
    cls: type[T],
    file: str | os.PathLike[str] | None = None,
    args: argparse.Namespace | Mapping[str, Any] | None = None,
    *,
    prefix: str = "",
) -> T:
    """The settings of a run: ``cls``'s defaults, then the config ``file``, then the flags ``args``.

    ``args`` is the namespace of a parser that :func:`add_dataclass_arguments` filled (with the same
    ``prefix``; other attributes are ignored), or a mapping of dotted keys (``{"train.lr": 1e-4}``)
    and nested mappings, with values as typed on a command line or already converted. A section
    set in part keeps its other values from the layer below (a file's ``train: {lr: 1e-4}`` keeps
    the default ``train.clip_eps_low``).
    """
    _check_class(cls)
    values: dict[str, Any] = {}
    if file is not None:
        values = _validate(cls, load_file(file), source=str(file))
    if args is not None:
        flags = _flag_values(cls, args, prefix)
        values = _merge(cls, values, _validate(cls, flags, source="flags", text=True, flag=True))
    return _build(
        cls,
        values,
        None,
        str(file)
        if file is not None and args is None
        else f"{file} + flags"
        if file is not None
        else "flags"
        if args is not None
        else cls.__name__,
    )


# ---- writing -------------------------------------------------------------------------------------


def markdown_reference(cls: type) -> str:
    """Every setting of ``cls`` as a Markdown table (key, flag, default, help): the config reference
    in the docs is this text, so it cannot drift from the class."""
    rows = ["| key | flag | default | meaning |", "|---|---|---|---|"]
    for setting in config_fields(cls):
        default = "required" if setting.default is dataclasses.MISSING else _show(setting.default)
        doc = " ".join(setting.doc.split()).replace("|", "\\|")
        rows.append(f"| `{setting.path}` | `--{_flag_name(setting.path)}` | `{default}` | {doc} |")
    return "\n".join(rows) + "\n"


def to_dict(value: Any) -> Any:
    """A config (or any value in one) as plain data: mappings, lists, strings, numbers, None."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_dict(getattr(value, f.name)) for f in dataclasses.fields(value) if f.init}
    if isinstance(value, Mapping):
        return {to_dict(k) if not isinstance(k, str) else k: to_dict(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [to_dict(v) for v in value]
    if isinstance(value, PurePath):
        return str(value)
    if isinstance(value, enum.Enum):
        return to_dict(value.value)
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return repr(value)  # an object (a custom CreditRule): recorded by name, not loadable back


def _yaml_value(value: Any) -> str:
    import yaml

    text = yaml.safe_dump(value, default_flow_style=True, width=2**31, allow_unicode=True)
    text = text.removesuffix("\n").removesuffix("\n...").strip()
    if "\n" in text:  # a multi-line string: a JSON string is a YAML double-quoted one
        return json.dumps(value, ensure_ascii=False)
    return text


def _yaml_lines(instance: Any, indent: int) -> Iterator[str]:
    pad = " " * indent
    docs = _docs(type(instance))
    for f in dataclasses.fields(instance):
        if not f.init:
            continue
        doc = " ".join(docs.get(f.name, "").split("\n\n")[0].split())
        if doc:
            yield f"{pad}# {doc}"
        value = getattr(instance, f.name)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            yield f"{pad}{f.name}:"
            yield from _yaml_lines(value, indent + 2)
        else:
            yield f"{pad}{f.name}: {_yaml_value(to_dict(value))}"


def dump(instance: Any, path: str | os.PathLike[str]) -> Path:
    """Write the resolved settings to ``path`` as YAML, each key under its help as a comment, so a
    run records what it used and ``resolve(cls, file=path)`` gives the same settings back."""
    if not dataclasses.is_dataclass(instance) or isinstance(instance, type):
        raise TypeError(f"expected a dataclass instance, got {instance!r}")
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    header = f"# {type(instance).__qualname__}: the resolved settings of this run (defaults < file < flags)\n"
    target.write_text(header + "\n".join(_yaml_lines(instance, 0)) + "\n", encoding="utf-8")
    return target


# ---- field docs: each field's help, read from the source ----------------------------------------


def field_docs(cls: type) -> dict[str, str]:
    """Each annotated field of ``cls`` (and of its bases, the closest definition winning) → its
    help text, in definition order; a field without a docstring or ``#:`` comment maps to ``""``.

    A settings dataclass documents each field with an attribute docstring, the string right under
    the field (the OpenAI Agents SDK's convention, and what editors show on hover); a ``#:``
    comment block right above a field counts when it has none. Python keeps no such string at run
    time, so they are read from the class's source with :mod:`ast`: the help is written once, next
    to the field, and ``--help`` and the config reference both show it.

    Raises ``TypeError`` when the source of ``cls`` cannot be read (a class made at run time).
    """
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if klass is object:
            continue
        try:
            lines, _ = inspect.getsourcelines(klass)
        except (OSError, TypeError) as exc:
            if klass is cls:
                raise TypeError(f"field_docs: cannot read the source of {cls.__qualname__}") from exc
            continue
        docs.update(_class_field_docs(lines))
    return docs


def _class_field_docs(lines: list[str]) -> dict[str, str]:
    source = textwrap.dedent("".join(lines))
    source_lines = source.splitlines()
    tree = ast.parse(source)
    classdef = next(node for node in tree.body if isinstance(node, ast.ClassDef))
    docs: dict[str, str] = {}
    body = classdef.body
    for i, node in enumerate(body):
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        following = body[i + 1] if i + 1 < len(body) else None
        if (
            isinstance(following, ast.Expr)
            and isinstance(following.value, ast.Constant)
            and isinstance(following.value.value, str)
        ):
            docs[node.target.id] = inspect.cleandoc(following.value.value)
        else:
            docs[node.target.id] = _comment_above(source_lines, node.lineno - 1)
    return docs


def _comment_above(lines: list[str], index: int) -> str:
    """The ``#:`` comment lines directly above line ``index`` (0-based), joined."""
    found: list[str] = []
    i = index - 1
    while i >= 0 and lines[i].strip().startswith("#:"):
        found.append(lines[i].strip()[2:].strip())
        i -= 1
    return " ".join(reversed(found))
