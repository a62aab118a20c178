"""The errors qkv raises on purpose, and the two ways it names what is missing: an optional library's extra
(:func:`require`) and the spelling a user may have meant (:func:`did_you_mean`).

Each error's message names the problem (file, line, key) and what to do; the command line prints it as one
line (``qkv/cli/__init__.py``).
"""

from __future__ import annotations

import difflib
import importlib
from typing import Any, Iterable


class QkvError(Exception):
    """Every error qkv raises on purpose: its message names the problem (file, line, key) and what to do.

    Each kind is also the built-in error of its nature, so ``except ValueError`` still catches bad input:
    ``ValueError`` kinds (config, data, run, device, tokenizer) are the user's input; the others
    (checkpoints, non-finite training, ranks) are failures while running.
    """


class ConfigError(QkvError, ValueError):
    """A configuration that cannot be built: unknown key, wrong type, or inconsistent values."""


class DataError(QkvError, ValueError):
    """Input that cannot be read: a missing or malformed file, a corpus unlike its registry entry.

    The message names the file (and line where there is one) and what to do.
    """


class DeviceError(QkvError, ValueError):
    """A device that was asked for but is not there (``cuda`` on a machine without CUDA)."""


class MissingDependencyError(QkvError, ImportError):
    """An optional library that one command needs is not installed; the message names the extra."""


def require(module: str, extra: str, purpose: str, package: str | None = None) -> Any:
    """Import the optional library ``module`` for ``purpose``, or say which qkv extra installs it.

    Example: ``require("transformers", "hf", "qkv export hf")`` -> the module, or the error
    "qkv export hf needs transformers, an optional part of qkv: pip install 'qkv[hf]'". ``package``
    names what is missing when it is not the module's first part (torch.utils.tensorboard needs
    tensorboard).
    """
    try:
        return importlib.import_module(module)
    except ImportError:
        raise MissingDependencyError(f"{purpose} needs {package or module.split('.')[0]}, an optional part of "
                                     f"qkv: pip install 'qkv[{extra}]'") from None


def did_you_mean(key: str, choices: Iterable[str], cutoff: float = 0.6) -> str:
    """`` (did you mean 'x'?)`` when a choice is close to ``key``, else ``""``: the tail of an error message."""
    close = difflib.get_close_matches(key, list(choices), n=1, cutoff=cutoff)
    return f" (did you mean {close[0]!r}?)" if close else ""


__all__ = ["QkvError", "ConfigError", "DataError", "DeviceError", "MissingDependencyError", "require", "did_you_mean"]
