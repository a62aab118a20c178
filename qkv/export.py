"""``qkv export hf``: a run as a Hugging Face model folder that ``from_pretrained`` and ``AutoTokenizer`` load.

A GPT run becomes a ``GPT2LMHeadModel`` (``qkv.models.convert``), a translation run a
``MarianMTModel`` (``qkv.models.marian``); each with its config, ``model.safetensors``, a generation
config that starts and stops as qkv does, and its tokenizer as a ``PreTrainedTokenizerFast``
(``qkv.tokenizers.hf``; a GPT converted from GPT-2 keeps GPT-2's own, from the Hub). The folder is
written beside its destination and renamed into place: it is there whole or not at all, and a
folder that holds anything is replaced only with ``overwrite``.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from qkv.io import as_os_error
from qkv.models import GPT, Transformer
from qkv.models.convert import gpt_to_hf
from qkv.models.marian import transformer_to_marian
from qkv.runs import Run, RunError, load_model
from qkv.tokenizers.gpt2 import GPT2Tokenizer
from qkv.tokenizers.hf import to_transformers


def _prepare_out(out: Path, overwrite: bool) -> None:
    if out.exists() and not out.is_dir():
        raise RunError(f"{out} is a file, not a folder: choose another --out")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise RunError(f"{out} is not empty: pass --overwrite to replace it, or choose another --out")


def _hf_model(model, tokenizer):
    """The HF model of a qkv model, its config's special ids those of ``tokenizer``."""
    if isinstance(model, Transformer):
        return transformer_to_marian(model, tokenizer.bos_id, tokenizer.eos_id)
    if isinstance(model, GPT):
        hf = gpt_to_hf(model)
        if not isinstance(tokenizer, GPT2Tokenizer):  # a converted GPT-2 keeps GPT-2's ids
            for name, i in (("bos_token_id", tokenizer.bos_id), ("eos_token_id", tokenizer.eos_id),
                            ("pad_token_id", tokenizer.pad_id)):
                setattr(hf.config, name, i)
                setattr(hf.generation_config, name, i)
        return hf
    raise RunError(f"cannot export a {type(model).__name__}")


def export_hf(run_dir: str | Path, out: str | Path, weights: str | None = None, overwrite: bool = False) -> Path:
    """Write the run's model and tokenizer as a Hugging Face folder at ``out``; returns ``out``.

    Raises:
        RunError: ``out`` holds something (without ``overwrite``), or the run cannot be exported.
        MarianUnsupported / ValueError: a model option HF's architecture cannot express (named).
        MissingDependencyError: ``transformers`` is not installed (the ``hf`` extra).
    """
    run, out = Run(run_dir), Path(out)
    _prepare_out(out, overwrite)
    model, tokenizer = load_model(run, weights, device="cpu")
    hf_model = _hf_model(model, tokenizer)
    hf_tokenizer = None if isinstance(tokenizer, GPT2Tokenizer) else to_transformers(
        tokenizer, translation=isinstance(model, Transformer))
    out.parent.mkdir(parents=True, exist_ok=True)
    with as_os_error(out):
        staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
        try:
            hf_model.save_pretrained(staging)
            if hf_tokenizer is not None:
                hf_tokenizer.save_pretrained(staging)
            _replace(staging, out)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return out


def _replace(staging: Path, out: Path) -> None:
    """Put the finished ``staging`` folder at ``out``: the old folder is moved aside first, removed last."""
    old = None
    if out.exists():
        old = out.with_name(f".{out.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        out.rename(old)
    staging.rename(out)
    if old is not None:
        shutil.rmtree(old)


__all__ = ["export_hf"]
