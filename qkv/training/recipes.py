"""Every job's recipe, read one way: ``qkv train mt``, ``qkv train lm``, ``qkv finetune``, the demo, the
experiments and the tests all call :func:`load`.

A recipe is a shipped recipe's name (``qkv/recipes/KIND/NAME.yaml``) or a YAML file, each section merged onto
that section's defaults; no recipe at all is the defaults. A resumed translation or GPT run reads the recipe
that ran, its own ``config.json``. Then ``section.key=value`` overrides, through the same checks.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from qkv.settings import apply_overrides, load_json, load_recipe
from qkv.runs import CONFIG_FILE
from qkv.training.finetune import FinetuneRecipe
from qkv.recipes import LMRecipe, MTRecipe

# The recipe of each kind of job. A fine-tuning recipe's file may hold its sections under `finetune:`; a
# fine-tuning run resumes from the command that started it (the trainer checks it against the run's record).
RECIPES: dict[str, type] = {"mt": MTRecipe, "lm": LMRecipe, "finetune": FinetuneRecipe}


def load(kind: str, recipe: str | Path | None = None, overrides: Sequence[str] = (),
         run_dir: str | Path | None = None, resume: bool = False) -> Any:
    """The recipe of a ``kind`` job (:data:`RECIPES`): on ``resume``, the run's own (translation, GPT); else recipe
    ``recipe`` (a shipped name or a YAML file), or the defaults; then the ``overrides``."""
    cls = RECIPES[kind]
    if resume and kind != "finetune":
        if run_dir is None:
            raise ValueError("--resume needs --run DIR")
        path = Path(run_dir) / CONFIG_FILE
        if not path.is_file():
            raise FileNotFoundError(f"{run_dir}: not a qkv run directory (no {CONFIG_FILE}); --resume continues a run "
                                    "that a trainer started there")
        cfg = load_json(path, cls)
    elif recipe is not None:
        return load_recipe(cls, kind, recipe, list(overrides), nested="finetune" if kind == "finetune" else None)
    else:
        cfg = cls()
    return apply_overrides(cfg, list(overrides)) if overrides else cfg


__all__ = ["RECIPES", "load"]
