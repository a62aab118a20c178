"""Configuration: frozen dataclasses with the paper's names, presets, YAML files and key=value overrides.

Defaults live once, in the dataclass fields. Every way of building a config (a preset, a YAML file, a
``key=value`` on the command line) goes through :func:`from_dict`, which rejects unknown keys with a
"did you mean" and checks types, so a typo never silently trains the wrong model.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field, fields, is_dataclass, replace
from pathlib import Path
from typing import Any, Mapping, Sequence, TypeVar

import yaml

from qkv.io import DataError, QkvError, did_you_mean, read_json, read_text_file, write_json

T = TypeVar("T")

POSITIONAL = ("sinusoidal", "learned", "rope", "none")
ACTIVATIONS = ("relu", "gelu", "gelu_tanh", "swiglu")
NORMS = ("post", "pre")
ARCHS = ("transformer", "gpt")


# Decoding as the paper's Section 6.1 does it, written once for every command and function: beam 4,
# length penalty alpha = 0.6, outputs at most 50 tokens longer than their source; and the token
# budget of one decoding batch (sources sorted by length and cut under it).
BEAM = 4
ALPHA = 0.6
EXTRA = 50
MAX_TOKENS = 4000


class ConfigError(QkvError, ValueError):
    """A configuration that cannot be built: unknown key, wrong type, or inconsistent values."""


@dataclass(frozen=True)
class ModelConfig:
    """Hyper-parameters of a Transformer (encoder-decoder) or a GPT (decoder-only).

    Names follow "Attention Is All You Need" (Table 3): ``d_model``, ``n_heads`` (h), ``d_ff``,
    ``n_layers`` (N), ``dropout`` (P_drop). ``n_layers`` is the depth of each stack; set
    ``n_decoder_layers`` for an asymmetric encoder-decoder.
    """

    arch: str = "transformer"
    vocab_size: int = 37000
    d_model: int = 512
    n_heads: int = 8
    d_ff: int = 2048
    n_layers: int = 6
    n_decoder_layers: int | None = None
    # d_k, the size of each head's queries and keys; None: d_model / h. Table 3 row (B) shrinks it alone,
    # the values keeping d_v = d_model / h.
    d_k: int | None = None
    dropout: float = 0.1
    # Dropout on the attention weights (the paper only drops sublayer outputs and embeddings, and
    # attention dropout inside SDPA costs ~30% on CPU); off unless asked for.
    attn_dropout: float = 0.0
    max_len: int = 1024
    positional: str = "sinusoidal"
    norm: str = "post"
    # A LayerNorm after the last layer of each stack. None = only for pre-norm (where the residual
    # stream is otherwise never normalized); the paper's post-norm model has none.
    final_norm: bool | None = None
    activation: str = "relu"
    bias: bool = True
    tie_embeddings: bool = True
    layer_norm_eps: float = 1e-5
    rope_base: float = 10000.0
    pad_id: int = 0

    def __post_init__(self) -> None:
        _check_choice("arch", self.arch, ARCHS)
        _check_choice("positional", self.positional, POSITIONAL)
        _check_choice("norm", self.norm, NORMS)
        _check_choice("activation", self.activation, ACTIVATIONS)
        for name in ("vocab_size", "d_model", "n_heads", "d_ff", "n_layers", "max_len"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"ModelConfig.{name} must be positive, got {getattr(self, name)}")
        if self.d_model % self.n_heads:
            raise ConfigError(
                f"ModelConfig: d_model={self.d_model} is not divisible by n_heads={self.n_heads} "
                "(each head has d_k = d_model / h dimensions)"
            )
        if self.d_k is not None and self.d_k <= 0:
            raise ConfigError(f"ModelConfig.d_k must be positive (or null: d_model / n_heads), got {self.d_k}")
        if self.positional == "rope" and self.key_dim % 2:
            raise ConfigError(f"ModelConfig: RoPE needs an even key dimension d_k, got {self.key_dim}")
        for name in ("dropout", "attn_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ConfigError(f"ModelConfig.{name} must be in [0, 1), got {getattr(self, name)}")

    @property
    def head_dim(self) -> int:
        """d_v = d_model / h (Section 3.2.2), and d_k too unless ``d_k`` is set."""
        return self.d_model // self.n_heads

    @property
    def key_dim(self) -> int:
        """d_k: the size of each head's queries and keys (``d_k``, else d_model / h)."""
        return self.d_k or self.head_dim

    @property
    def decoder_layers(self) -> int:
        return self.n_decoder_layers if self.n_decoder_layers is not None else self.n_layers

    @property
    def use_final_norm(self) -> bool:
        return self.final_norm if self.final_norm is not None else self.norm == "pre"


def _check_choice(name: str, value: str, choices: Sequence[str]) -> None:
    if value not in choices:
        raise ConfigError(f"ModelConfig.{name}={value!r} is not one of {list(choices)}{did_you_mean(value, choices)}")


# Presets. The paper's sizes (Table 3) assume one shared source/target vocabulary of about 37,000
# BPE tokens; with exactly 37,000, biases, tied embeddings and post-norm, base has 63,082,496
# parameters and big 214,245,376 (the paper reports 65M and 213M).
PRESETS: dict[str, ModelConfig] = {
    "transformer-base": ModelConfig(
        arch="transformer", vocab_size=37000, d_model=512, n_heads=8, d_ff=2048, n_layers=6, dropout=0.1
    ),
    "transformer-big": ModelConfig(
        arch="transformer", vocab_size=37000, d_model=1024, n_heads=16, d_ff=4096, n_layers=6, dropout=0.3
    ),
    "gpt2-small": ModelConfig(
        arch="gpt", vocab_size=50257, d_model=768, n_heads=12, d_ff=3072, n_layers=12, dropout=0.1,
        max_len=1024, positional="learned", norm="pre", activation="gelu_tanh", bias=True,
    ),
    # nanoGPT's config/train_shakespeare_char.py (bias=False is nanoGPT's train.py default).
    "nanogpt-shakespeare-char": ModelConfig(
        arch="gpt", vocab_size=65, d_model=384, n_heads=6, d_ff=1536, n_layers=6, dropout=0.2,
        max_len=256, positional="learned", norm="pre", activation="gelu", bias=False,
    ),
    "tiny-transformer": ModelConfig(
        arch="transformer", vocab_size=64, d_model=32, n_heads=4, d_ff=64, n_layers=2, dropout=0.0, max_len=64
    ),
    "tiny-gpt": ModelConfig(
        arch="gpt", vocab_size=64, d_model=32, n_heads=4, d_ff=64, n_layers=2, dropout=0.0, max_len=64,
        positional="learned", norm="pre", activation="gelu_tanh",
    ),
}

# The figure the paper's Table 3 prints for each preset that reproduces it.
PAPER_PARAMS = {"transformer-base": "65M", "transformer-big": "213M", "gpt2-small": "124M"}


def preset(name: str, **overrides: Any) -> ModelConfig:
    """A named preset, optionally with some fields replaced (``preset("tiny-gpt", vocab_size=100)``)."""
    if name not in PRESETS:
        raise ConfigError(f"unknown preset {name!r}{did_you_mean(name, PRESETS)}; known: {sorted(PRESETS)}")
    return from_dict(ModelConfig, {**dataclasses.asdict(PRESETS[name]), **overrides}, where=f"preset {name}")


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
        kwargs[key] = _coerce(value, hints[key], f"{where}.{key}")
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
    try:
        cfg = from_dict(cls, data, where=str(path))
    except ConfigError as e:  # a value a config's own check refuses (d_model -3) names its class, not the file
        raise ConfigError(str(e) if str(e).startswith(str(path)) else f"{path}: {e}") from None
    return apply_overrides(cfg, overrides) if overrides else cfg


def save_json(cfg: Any, path: str | Path) -> None:
    """Save the resolved config (what actually ran) next to the weights, atomically (a kill never truncates it)."""
    write_json(path, to_dict(cfg))


def upgrade_saved(cls: type, data: Mapping[str, Any]) -> dict[str, Any]:
    """A config saved before recipes had one shape, in today's: settings outside the sections go to ``train``
    (translation runs were flat), and renamed knobs take their new names (:data:`RENAMED`)."""
    data = dict(data)
    sections = {f.name for f in fields(cls)}
    if "train" not in sections:
        return data
    train = dict(data.get("train") or {})
    for key in [k for k in data if k not in sections]:
        train[key] = data.pop(key)
    data["train"] = {RENAMED.get(k, k): v for k, v in train.items()}
    return data


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
    if not isinstance(data, Mapping):
        raise ConfigError(f"{path}: expected a mapping of settings, got {type(data).__name__}")
    return from_dict(cls, upgrade_saved(cls, data), where=str(path))


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


__all__ = [
    "BEAM", "ALPHA", "EXTRA", "MAX_TOKENS", "ConfigError", "ModelConfig", "PRESETS", "PAPER_PARAMS", "preset", "from_dict", "to_dict",
    "apply_overrides", "read_yaml_mapping", "load_yaml", "save_json", "load_json", "upgrade_saved", "RENAMED",
    "RECIPES_DIR", "recipe_names", "recipe_file", "load_recipe", "field", "replace",
]
