"""Typed settings from plain data: dataclasses built from YAML, JSON and ``key=value``, and the recipe files.

Every way of building a config (a preset, a YAML recipe, a run's ``config.json``, a ``section.key=value``
on the command line) goes through :func:`from_dict`, which rejects unknown keys with a "did you mean" and
checks types, so a typo never silently trains the wrong model. Recipes ship in ``qkv/recipes/KIND/`` and
are named by name (:func:`recipe_file`); runs saved by earlier versions are upgraded as they are read
(:func:`upgrade_saved`).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence, TypeVar

import yaml

from qkv.errors import ConfigError, DataError, did_you_mean
from qkv.files import read_json, read_text_file, write_json

T = TypeVar("T")


# ----------------------------------------------------------------------------------------------
# Building dataclasses from plain data (YAML, JSON, key=value), with errors that name the key.


def _coerce(value: Any, tp: Any, where: str) -> Any:
    """Check/convert ``value`` to the annotated type ``tp`` (bool, int, float, str, Optional, list, dataclass)."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, getattr(types, "UnionType", typing.Union)):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, where)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(errors[0] if errors else f"{where}: cannot be None")
    if origin in (list, tuple, Sequence) or tp in (list, tuple):
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        inner = args[0] if args else Any
        out = [_coerce(v, inner, f"{where}[{i}]") for i, v in enumerate(value)]
        return tuple(out) if origin is tuple or tp is tuple else out
    if is_dataclass(tp):
        if is_dataclass(value):
            return value
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where}: expected a mapping of {tp.__name__} fields, got {value!r}")
        return from_dict(tp, value, where=where)
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "yes", "1", "on", "false", "no", "0", "off"):
            return value.lower() in ("true", "yes", "1", "on")
        raise ConfigError(f"{where}: expected true or false, got {value!r}")
    if tp is int:
        if isinstance(value, bool):
            raise ConfigError(f"{where}: expected an integer, got {value!r}")
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            try:
                return int(value.replace("_", ""))
            except ValueError:
                try:
                    f = float(value)
                except ValueError:
                    f = None
                if f is not None and f.is_integer():
                    return int(f)
        raise ConfigError(f"{where}: expected an integer, got {value!r}")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
        raise ConfigError(f"{where}: expected a number, got {value!r}")
    if tp is str:
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
        raise ConfigError(f"{where}: expected a string, got {value!r}")
    return value


# Knobs that every job names the paper's way since recipes share one shape. A recipe file with an old
# name gets an error that gives the new one; a run saved with old names is upgraded as it loads.
RENAMED = {"max_steps": "steps", "max_iters": "steps", "grad_accum": "accumulate", "grad_clip": "clip_norm",
           "eval_interval": "eval_every", "log_interval": "log_every", "checkpoint_interval": "checkpoint_every",
           "lr_decay_iters": "decay_steps"}


def _field_default(cls: type, name: str) -> Any:
    f = next(f for f in fields(cls) if f.name == name)
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None if f.default is dataclasses.MISSING else f.default


def _inside(where: str, key: str) -> str:
    """Where ``key`` of the mapping at ``where`` is: ``runs/x/config.json: train``, then ``...: train.steps``
    (a file's name and the keys inside it kept apart, so that a section never reads as part of a file name)."""
    return f"{where}: {key}" if where.endswith((".json", ".yaml", ".yml")) else f"{where}.{key}"


def from_dict(cls: type[T], data: Mapping[str, Any], where: str | None = None) -> T:
    """Build the dataclass ``cls`` from a mapping; unknown keys and wrong types are errors naming the key.

    A section (a field that is itself a dataclass) given as a mapping is merged onto that field's
    default: a recipe's partial ``model:`` keeps the recipe's default model for the keys it leaves
    out, not the paper's base model.
    """
    where = where or cls.__name__
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where}: expected a mapping, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in fields(cls) if f.init}
    kwargs = {}
    for key, value in data.items():
        if key not in names:
            if RENAMED.get(key) in names:
                raise ConfigError(f"{where}: {key!r} is called {RENAMED[key]!r} now (one set of names for every "
                                  "recipe); rename it")
            raise ConfigError(f"{where}: unknown key {key!r}{did_you_mean(key, names)}")
        if is_dataclass(hints[key]) and isinstance(value, Mapping):
            default = _field_default(cls, key)
            if is_dataclass(default):
                value = {**to_dict(default), **value}
        kwargs[key] = _coerce(value, hints[key], _inside(where, key))
    try:
        return cls(**kwargs)
    except TypeError as e:  # a required field is missing
        raise ConfigError(f"{where}: {e}") from None


def to_dict(cfg: Any) -> dict[str, Any]:
    """A plain, JSON/YAML-serializable dict of a (nested) dataclass."""
    return dataclasses.asdict(cfg)


def apply_overrides(cfg: T, overrides: Sequence[str]) -> T:
    """Apply ``key=value`` strings (``model.d_model=256``, ``lr=3e-4``) to a frozen dataclass.

    Values are parsed as YAML scalars (so ``true``, ``1e-3`` and ``[1, 2]`` work) and then checked
    against the field's type by :func:`from_dict`.
    """
    data = to_dict(cfg)
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not of the form key=value")
        key, raw = item.split("=", 1)
        try:
            value = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError:
            raise ConfigError(f"override {item!r}: the value is not valid YAML; quote it (key='...')") from None
        node, parts = data, key.strip().split(".")
        for depth, part in enumerate(parts):
            if not isinstance(node, dict):
                raise ConfigError(f"override {key!r}: {'.'.join(parts[:depth])} is not a section")
            if part not in node:
                raise ConfigError(f"override {key!r}: unknown key {part!r}{did_you_mean(part, node)}")
            if depth == len(parts) - 1:
                node[part] = value
            else:
                node = node[part]
    return from_dict(type(cfg), data)


def read_yaml_mapping(path: str | Path) -> dict[str, Any]:
    """The top-level mapping of a YAML file; a missing file or bad YAML is an error naming the file."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        data = yaml.safe_load(read_text_file(path)) or {}
    except DataError as e:  # not UTF-8: the file, line and byte
        raise ConfigError(str(e)) from None
    except yaml.YAMLError as e:  # one line: file:line, what YAML expected (its own message draws a caret)
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(f"{where}: not valid YAML ({problem})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of settings at the top level, got {type(data).__name__}")
    return data


def load_yaml(path: str | Path, cls: type[T], overrides: Sequence[str] = (), nested: str | None = None) -> T:
    """Read a YAML config file into ``cls`` and apply ``key=value`` overrides; errors name the file. ``nested``:
    the file may hold the sections under that key (a larger file with a ``finetune:`` part)."""
    data = read_yaml_mapping(path)
    if nested and nested in data:
        data = data[nested]
        if not isinstance(data, Mapping):
            raise ConfigError(f"{path}: the {nested} section must be a mapping of sections (train: ...)")
        path = f"{path} ({nested})"
    if not data:  # an empty file trains nothing it says: the defaults, which no one asked for by name
        raise ConfigError(f"{path}: the recipe is empty; give its model:, data: and train: sections (as "
                          "the shipped recipes in qkv/recipes/ do), or leave out --recipe to train the defaults")
    cfg = _from_file(cls, data, path)
    return apply_overrides(cfg, overrides) if overrides else cfg


def _from_file(cls: type[T], data: Mapping[str, Any], path: str | Path) -> T:
    """:func:`from_dict` of the settings a file holds; every error names the file."""
    try:
        return from_dict(cls, data, where=str(path))
    except ConfigError as e:  # a value a config's own check refuses (d_model -3) names its class, not the file
        raise ConfigError(str(e) if str(e).startswith(str(path)) else f"{path}: {e}") from None


def save_json(cfg: Any, path: str | Path) -> None:
    """Save the resolved config (what actually ran) next to the weights, atomically (a kill never truncates it)."""
    write_json(path, to_dict(cfg))


def upgrade_saved(cls: type, data: Mapping[str, Any]) -> dict[str, Any]:
    """A config saved before recipes had one shape, in today's: the ``train`` knobs outside the sections go to
    ``train`` (translation runs were flat), and renamed knobs take their new names (:data:`RENAMED`). Any other
    key outside the sections stays where it is, for :func:`from_dict` to refuse by name (a misspelled section
    is not a knob)."""
    data = dict(data)
    sections = {f.name for f in fields(cls)}
    train_cls = typing.get_type_hints(cls).get("train")
    if not is_dataclass(train_cls):
        return data
    knobs = {f.name for f in fields(train_cls)}
    train = dict(data.get("train") or {})
    for key in [k for k in data if k not in sections and RENAMED.get(k, k) in knobs]:
        train[key] = data.pop(key)
    data["train"] = {RENAMED.get(k, k): v for k, v in train.items()}
    return data


def read_saved(cls: type[T], data: Any, path: str | Path) -> T:
    """The data of a saved config (a run's ``config.json``) read into ``cls`` as a recipe file is: upgraded if it
    is older than the recipe shape (:func:`upgrade_saved`), then :func:`from_dict`, whose errors (an unknown key
    and the nearest known one, a wrong type, a value a section's own check refuses) name the file."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{path}: expected a mapping of settings, got {type(data).__name__}")
    return _from_file(cls, upgrade_saved(cls, data), path)


def load_json(path: str | Path, cls: type[T]) -> T:
    """Read a saved config (a run's ``config.json``) into ``cls``, upgraded if it is older than the recipe shape.

    A missing or damaged file is an error naming it.
    """
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        data = read_json(path, "config")
    except DataError as e:
        raise ConfigError(str(e)) from None
    return read_saved(cls, data, path)


# ----------------------------------------------------------------------------------------------
# Recipes: YAML files with model, data and train sections, shipped inside the package and named by name.

RECIPES_DIR = Path(__file__).resolve().parent / "recipes"


def recipe_names(kind: str) -> list[str]:
    """The recipes shipped for ``kind`` (``mt`` or ``lm``), by name."""
    return sorted(p.stem for p in (RECIPES_DIR / kind).glob("*.yaml"))


def recipe_file(kind: str, name: str | Path) -> Path:
    """The YAML file of recipe ``name``: a shipped recipe of ``kind`` (``qkv/recipes/KIND/NAME.yaml``) or a path."""
    path = Path(name)
    if path.is_file():
        return path
    shipped = RECIPES_DIR / kind / f"{name}.yaml"
    if shipped.is_file():
        return shipped
    if path.suffix in (".yaml", ".yml") or len(path.parts) > 1:
        raise ConfigError(f"recipe file not found: {path}")
    known = recipe_names(kind)
    raise ConfigError(f"unknown {kind} recipe {str(name)!r}{did_you_mean(str(name), known)}; shipped: "
                      f"{', '.join(known)} (or give the path of a YAML file)")


def load_recipe(cls: type[T], kind: str, name: str | Path, overrides: Sequence[str] = (),
                nested: str | None = None) -> T:
    """Recipe ``name`` (see :func:`recipe_file`) read into ``cls``, each section merged onto its defaults, then
    ``section.key=value`` overrides; errors name the file and the key."""
    return load_yaml(recipe_file(kind, name), cls, overrides, nested)


__all__ = ["from_dict", "to_dict", "apply_overrides", "read_yaml_mapping", "load_yaml", "save_json", "load_json",
           "upgrade_saved", "read_saved", "RENAMED", "RECIPES_DIR", "recipe_names", "recipe_file", "load_recipe"]
