"""A GPT run's recipe read back (its shape, :class:`~qkv.recipes.LMRecipe`, is in :mod:`qkv.recipes`), and a run
converted from GPT-2.

The run directory itself (its files, weights and loading) is :mod:`qkv.runs`. A GPT run also holds
``tokens.bin(.json)``, the corpus tokenized once (memory-mapped, see :mod:`qkv.data.lm`); a
fine-tuning run (``qkv finetune``) holds ``finetune.json``; a run converted from GPT-2 (``qkv convert
gpt2``) holds config.json, tokenizer.json (+ tokenizer.bpe) and model.safetensors.
"""

from __future__ import annotations

from pathlib import Path

from qkv.errors import require
from qkv.settings import load_json, save_json
from qkv.recipes import LMDataConfig, LMRecipe
from qkv.interop.gpt2 import gpt_from_hf
from qkv.runs import CONFIG_FILE, MODEL_WEIGHTS_NAME, Run, RunError, one_writer
from qkv.tokenizers.gpt2 import GPT2Tokenizer
from qkv.weights import save_weights



def load_run_recipe(run_dir: str | Path) -> LMRecipe:
    """The resolved recipe saved in a run directory."""
    path = Path(run_dir) / CONFIG_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{run_dir}: not a qkv GPT run directory (no {CONFIG_FILE})")
    return load_json(path, LMRecipe)


@one_writer("run_dir")
def convert_gpt2_run(source: str | Path, run_dir: str | Path, tokenizer: str | Path | None = None) -> Path:
    """Write a run directory holding a Hugging Face GPT-2 (``GPT2LMHeadModel``) and GPT-2's tokenizer.

    ``qkv generate`` and ``qkv eval lm --text FILE`` then use it as any run. It holds no pretraining
    corpus, which ``qkv finetune`` needs for its before/after scores. The tokenizer comes from
    ``merges.txt`` and ``vocab.json`` in ``tokenizer`` (a folder), else in ``source`` when it is a
    folder that has them, else from tiktoken (``qkv.tokenizers.gpt2``, which may download them).

    Args:
        source: a model name Hugging Face can load (downloads it) or a folder saved by ``save_pretrained``.
        run_dir: the new run directory (it must not hold a run yet).
        tokenizer: a folder with GPT-2's ``merges.txt`` and ``vocab.json``, when they are not beside the weights.
    """
    transformers = require("transformers", "hf", "qkv convert gpt2")
    run_dir, folder = Path(run_dir), Path(source)
    if Run(run_dir).started:
        raise RunError(f"{run_dir} already holds a run; pick another --run")
    if not folder.is_dir() and (folder.is_absolute() or str(source).startswith(".")):
        raise FileNotFoundError(f"{source}: no such folder (--from takes a folder saved by save_pretrained, or "
                                "a model name to download such as gpt2)")
    files = ("merges.txt", "vocab.json")
    if tokenizer is not None:
        missing = [name for name in files if not (Path(tokenizer) / name).is_file()]
        if missing:
            raise FileNotFoundError(f"{tokenizer}: no {' or '.join(missing)} (GPT-2's tokenizer files, as "
                                    "save_pretrained writes them)")
    # The weights first: a wrong --from is named before the tokenizer (which may need a download) is sought.
    try:
        hf_model = transformers.GPT2LMHeadModel.from_pretrained(str(source))
    except OSError as e:  # not a folder of weights, and no such model (or no network to fetch it)
        raise FileNotFoundError(f"{source}: no GPT-2 weights there ({str(e).splitlines()[0][:200]})") from None
    folder = Path(tokenizer) if tokenizer is not None else folder
    if all((folder / name).is_file() for name in files):
        gpt2_tokenizer = GPT2Tokenizer.from_files(folder / "merges.txt", folder / "vocab.json")
    else:
        gpt2_tokenizer = GPT2Tokenizer.from_tiktoken()
    model = gpt_from_hf(hf_model)
    if model.cfg.vocab_size != gpt2_tokenizer.vocab_size:
        raise ValueError(f"{source}: the model has {model.cfg.vocab_size} token embeddings, GPT-2's tokenizer "
                         f"{gpt2_tokenizer.vocab_size} ids")
    recipe = LMRecipe(model=model.cfg, data=LMDataConfig(corpus="", tokenizer="gpt2", start=""))
    run_dir.mkdir(parents=True, exist_ok=True)
    gpt2_tokenizer.save(run_dir)
    save_json(recipe, run_dir / CONFIG_FILE)
    save_weights(run_dir / MODEL_WEIGHTS_NAME, model, metadata={"converted_from": str(source)})
    Run(run_dir).finish(0)
    return run_dir
