"""``qkv export hf|ctranslate2``: a run as a model folder another library loads.

- ``hf``: a folder that ``from_pretrained`` and ``AutoTokenizer`` load. A GPT run becomes a
  ``GPT2LMHeadModel`` (``qkv.interop.gpt2``), a translation run a ``MarianMTModel``
  (``qkv.interop.marian``); each with its config, ``model.safetensors``, a generation config that
  starts and stops as qkv does, and its tokenizer as a ``PreTrainedTokenizerFast``
  (``qkv.tokenizers.hf``; a GPT converted from GPT-2 keeps GPT-2's own, from the Hub).
- ``ctranslate2``: a folder that ``ctranslate2.Translator`` (translation) or ``ctranslate2.Generator``
  (a GPT) loads (``qkv.interop.ctranslate2``): its ``model.bin``, ``config.json`` and vocabulary, in
  fp32 or quantized by CTranslate2 (``int8``...), with qkv's ``tokenizer.json`` beside them.

Either folder is written beside its destination and renamed into place: it is there whole or not at
all, and a folder that holds anything is replaced only with ``overwrite``. Its files get the modes of
those they replace, or a new file's (``qkv.files.match_mode``).
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

from qkv.files import as_os_error, match_mode
from qkv.models import GPT, Transformer
from qkv.interop.gpt2 import gpt_to_hf
from qkv.interop.ctranslate2 import to_ctranslate2
from qkv.interop.marian import transformer_to_marian
from qkv.runs import TOKENIZER_FILE, Run, RunError, load_model
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
    with staged(out) as staging:
        hf_model.save_pretrained(staging)
        if hf_tokenizer is not None:
            hf_tokenizer.save_pretrained(staging)
    return out


# CTranslate2's weight types of a CPU model (``ct2-transformers-converter --quantization``); None keeps fp32.
CT2_QUANTIZATIONS = ("int8", "int8_float32", "int16", "float16", "bfloat16", "int8_float16", "int8_bfloat16")


def export_ctranslate2(run_dir: str | Path, out: str | Path, weights: str | None = None, overwrite: bool = False,
                       quantization: str | None = None) -> Path:
    """Write the run's model as a CTranslate2 folder at ``out`` (fp32, or ``quantization``); returns ``out``.

    Raises:
        RunError: ``out`` holds something (without ``overwrite``), or the run cannot be exported.
        CTranslate2Unsupported: a model option CTranslate2's specs cannot express (named).
        MissingDependencyError: ``ctranslate2`` is not installed (the ``ctranslate2`` extra).
    """
    if quantization is not None and quantization not in CT2_QUANTIZATIONS:
        raise RunError(f"--quantization {quantization}: expected one of {', '.join(CT2_QUANTIZATIONS)}")
    run, out = Run(run_dir), Path(out)
    _prepare_out(out, overwrite)
    model, tokenizer = load_model(run, weights, device="cpu")
    spec = to_ctranslate2(model, tokenizer)
    spec.optimize(quantization=quantization)
    with staged(out) as staging:
        spec.save(str(staging))
        shutil.copyfile(run.file(TOKENIZER_FILE), staging / TOKENIZER_FILE)
    return out


@contextlib.contextmanager
def staged(out: Path) -> Iterator[Path]:
    """A new empty folder beside ``out`` to write into; put at ``out`` when the block ends without an error,
    removed if it fails (``out`` is then as it was)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with as_os_error(out):
        staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
        try:
            yield staging
            # mkdtemp's folder is private, and so are the files that libraries write through temporary
            # files of their own (safetensors): each takes the mode of what it replaces, or a new file's.
            for path in [staging, *staging.rglob("*")]:
                match_mode(path, out / path.relative_to(staging))
            _replace(staging, out)
        finally:
            shutil.rmtree(staging, ignore_errors=True)


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


__all__ = ["export_hf", "export_ctranslate2", "CT2_QUANTIZATIONS", "staged"]
