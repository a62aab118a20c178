"""The run directory: one folder that holds everything needed to use, continue or inspect a model.

Every job writes one (``qkv train mt``, ``qkv train lm``, ``qkv finetune``, ``qkv demo``, ``qkv convert
gpt2``) and every command that uses a model reads one (``translate``, ``generate``, ``eval``,
``explore``, ``plot``). This module alone knows its file names and how its files belong together:

    config.json           the resolved recipe that ran (``model``, ``data``, ``train`` sections)
    tokenizer.json        the tokenizer (a GPT-2 run also keeps ``tokenizer.bpe``)
    model.safetensors     the weights to use: the trainer's final choice
    best.safetensors      weights at the best validation score
    average.safetensors   the average of the last K checkpoints (translation, Section 6.1)
    last.safetensors      \\ the latest checkpoint: weights, and the trainer state of an exact --resume
    last.pt               /  (the two carry one id, so a mismatched pair is refused)
    step_N.safetensors    the last K checkpoints' weights, for averaging (translation)
    tokens.bin(.json)     the corpus tokenized once (GPT; see qkv.data.lm)
    metrics.jsonl         one JSON object per logged event
    curves.png            loss, learning rate (and BLEU) against step
    results.json          the final scores
    finetune.json         a fine-tuning run's settings and its base run
    finished.json         written last, when the job that writes the run has ended (Run.finish): the run is done

Weights are named by one vocabulary everywhere (``--weights``): ``model``, ``best``, ``last``,
``average``, or the path of a ``.safetensors`` file. The default is ``model``, else ``best``, else
``last`` (a run stopped before its end).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import shlex
import shutil
import sys
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar

import torch
from torch import nn

from qkv import locks
from qkv.config import ModelConfig
from qkv.errors import ConfigError, DataError, QkvError, did_you_mean
from qkv.recipes import RUN_RECIPES
from qkv.settings import read_saved, to_dict
from qkv.data.lm import TOKENS_FILE
from qkv.devices import resolve_device
from qkv.files import as_os_error, left_behind, left_behind_in, read_json, write_json
from qkv.parallel import launched_rank
from qkv.models.kinds import KINDS
from qkv.tokenizers import TOKENIZER_FILE, Tokenizer, TokenizerError, load_tokenizer
from qkv.weights import WEIGHTS_SUFFIX, CheckpointError, NonFiniteWeights, load_state_dict_into, read_weights

CONFIG_FILE = "config.json"
METRICS_FILE = "metrics.jsonl"
CURVES_FILE = "curves.png"
RESULTS_FILE = "results.json"
PRONOUNS_JSON = "pronouns.json"  # qkv explain: which heads resolve pronouns, and what switching each off does
PRONOUNS_PNG = "pronouns.png"
FINETUNE_FILE = "finetune.json"
FINISHED_FILE = "finished.json"  # the last file a job writes: the run is finished (Run.exists)
ADAPTER_FILE = "adapter.safetensors"
TENSORBOARD_DIR = "tensorboard"  # TensorBoard's event files (train.logger: tensorboard)
LAST = "last"  # the checkpoint an exact --resume continues from
MODEL_WEIGHTS_NAME = "model.safetensors"  # the weights a run is used with
BEST_WEIGHTS_NAME = "best.safetensors"
AVERAGE_WEIGHTS_NAME = "average.safetensors"  # the average of the last checkpoints (translation)
STEP_PREFIX = "step_"

# The weights a run may hold, by name (``--weights NAME``); anything else is a path.
WEIGHT_NAMES = ("model", "best", "last", "average")
# What a run is used with when no name is given: the final choice, else the best, else the last.
_DEFAULT_WEIGHTS = ("model", "best", "last")
# Files a fresh run replaces when asked to (--overwrite); step_*, .hyp and tokens files as well.
_RUN_FILES = (CONFIG_FILE, TOKENIZER_FILE, METRICS_FILE, CURVES_FILE, RESULTS_FILE, FINETUNE_FILE, FINISHED_FILE,
              ADAPTER_FILE,
              *(f"{n}{WEIGHTS_SUFFIX}" for n in WEIGHT_NAMES), f"{LAST}.pt")
# Where the replaced run waits until the new one has started (Run.starting).
REPLACED_DIR = ".replaced"
# The lock of the run's one writer (Run.writing), which also says who holds it.
WRITER_LOCK = ".writer.lock"
_HELD: set[Path] = set()  # the runs this process holds the writer lock of



class RunError(QkvError, ValueError):
    """A run directory that is missing, incomplete, or whose files do not belong together."""


class Run:
    """A run directory: its files by name, its config, tokenizer and weights.

    Nothing is read until asked for; each file is read once.

    Example:
        >>> run = Run("runs/demo")                       # doctest: +SKIP
        >>> model, tokenizer = load_model(run, "best")   # doctest: +SKIP
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    @classmethod
    def of(cls, run: Run | str | Path) -> Run:
        """``run`` itself, or the Run of a path: what every function that takes "a run or its path" starts with."""
        return run if isinstance(run, Run) else cls(run)

    def __repr__(self) -> str:
        return f"Run({str(self.path)!r})"

    def __fspath__(self) -> str:
        return str(self.path)

    def file(self, name: str) -> Path:
        """The path of ``name`` inside the run."""
        return self.path / name

    @property
    def exists(self) -> bool:
        """Whether the directory holds a finished run: its weights (``model.safetensors``) and ``finished.json``,
        which the job that wrote the run writes last (:meth:`finish`). A run stopped part way (killed,
        interrupted, stopped by a NaN) holds a config.json, a tokenizer and metrics, maybe a checkpoint, but is
        not one: ``--resume`` continues it from its checkpoint (:attr:`has_checkpoint`), or it starts again."""
        return self.file(MODEL_WEIGHTS_NAME).is_file() and self.file(FINISHED_FILE).is_file()

    @property
    def started(self) -> bool:
        """Whether the directory holds a run, finished or not (its ``config.json``)."""
        return self.file(CONFIG_FILE).is_file()

    def finish(self, step: int) -> Path:
        """Mark the run finished (:attr:`exists`): ``finished.json``, written atomically, the last file of every job
        that writes a run, once its weights and everything else are written."""
        return write_json(self.file(FINISHED_FILE), {"step": step, "weights": MODEL_WEIGHTS_NAME})

    def unfinish(self) -> None:
        """A finished run that is resumed to train further is not finished until it ends again."""
        self.file(FINISHED_FILE).unlink(missing_ok=True)

    @property
    def has_checkpoint(self) -> bool:
        """Whether ``last.pt`` is there, or the save of the first one was interrupted between its two
        renames (``last.safetensors`` and ``last.pt``'s complete temporary file, which loading checks
        and finishes): a run that ``--resume`` can continue."""
        state = self.file(f"{LAST}.pt")
        return state.is_file() or (self.file(f"{LAST}{WEIGHTS_SUFFIX}").is_file() and bool(left_behind(state)))

    # ------------------------------------------------------------------------------------------
    # The config

    @functools.cached_property
    def config(self) -> dict[str, Any]:
        """The JSON of ``config.json`` as it is, unchecked but for its ``model`` section (which says the run's kind,
        :attr:`arch`); the settings are read through :attr:`recipe`."""
        if not self.path.is_dir():
            raise FileNotFoundError(f"run directory not found: {self.path} (a run is written by `qkv train mt`, "
                                    "`qkv train lm` or `qkv demo`)")
        path = self.file(CONFIG_FILE)
        if not path.is_file():
            raise FileNotFoundError(f"{self.path}: no {CONFIG_FILE} (the resolved config every run holds); is this "
                                    "a qkv run directory (from `qkv train`, `qkv finetune` or `qkv demo`)?")
        try:
            data = read_json(path, "run config")
        except DataError as e:
            raise RunError(str(e)) from None
        if not isinstance(data, dict) or not isinstance(data.get("model"), dict):
            raise RunError(f"{path}: no 'model' section; not a config written by qkv")
        return data

    @property
    def arch(self) -> str:
        """``transformer`` (encoder-decoder) or ``gpt`` (decoder-only)."""
        arch = self.config["model"].get("arch", "transformer")
        if arch not in KINDS:
            raise RunError(f"{self.file(CONFIG_FILE)}: model.arch is {arch!r}, expected one of "
                           f"{list(KINDS)}{did_you_mean(str(arch), KINDS)}")
        return arch

    @functools.cached_property
    def recipe(self) -> Any:
        """``config.json`` read as strictly as a recipe file is (:func:`qkv.settings.read_saved`), into the recipe
        of the run's kind (:data:`qkv.recipes.RUN_RECIPES`: an ``MTRecipe`` or an ``LMRecipe``): a key or a
        section no recipe has is an error that names the file, the key and the nearest known one. Every
        command that uses a run reads its settings here, so none ignores a typo that another refuses."""
        try:
            return read_saved(RUN_RECIPES[self.arch], self.config, self.file(CONFIG_FILE))
        except ConfigError as e:
            raise RunError(str(e)) from None

    @property
    def model_config(self) -> ModelConfig:
        """The model's :class:`ModelConfig`, as it ran (vocabulary size from the tokenizer)."""
        return self.recipe.model

    def section(self, name: str) -> dict[str, Any]:
        """A section of the recipe (``data``, ``train``), every setting in it (a default where the file has none)."""
        return to_dict(getattr(self.recipe, name))

    @property
    def start_text(self) -> str:
        """What an empty prompt starts from (a GPT run's ``data.start``; nanoGPT samples from a newline)."""
        return str(self.section("data").get("start", "\n"))

    # ------------------------------------------------------------------------------------------
    # Tokenizer, weights, base run, corpus

    def tokenizer(self) -> Tokenizer:
        """The run's tokenizer, checked against the model's vocabulary size."""
        if not self.file(TOKENIZER_FILE).is_file():
            raise FileNotFoundError(f"{self.path}: missing {TOKENIZER_FILE}; a run holds {CONFIG_FILE}, "
                                    f"{TOKENIZER_FILE} and its weights")
        try:
            tokenizer = load_tokenizer(self.path)
        except TokenizerError as e:
            raise RunError(str(e)) from None
        if tokenizer.vocab_size != self.model_config.vocab_size:
            raise RunError(f"{self.file(TOKENIZER_FILE)} has {tokenizer.vocab_size} entries but "
                           f"{self.file(CONFIG_FILE)} says vocab_size {self.model_config.vocab_size}: "
                           "the files come from different runs")
        return tokenizer

    def weights_path(self, which: str | Path | None = None) -> Path:
        """The weights file named ``which`` (see the module docstring); it must exist.

        Raises:
            FileNotFoundError: naming the files that were looked for.
        """
        if which is None:
            for name in _DEFAULT_WEIGHTS:
                path = self.file(f"{name}{WEIGHTS_SUFFIX}")
                if path.exists() or path.is_symlink():  # one that is there but is no file is an error, not skipped
                    return _regular(path)
            names = ", ".join(n + WEIGHTS_SUFFIX for n in _DEFAULT_WEIGHTS)
            raise FileNotFoundError(f"{self.path}: no weights ({names}); the run has not saved any yet")
        name = str(which)
        path = self.file(f"{name}{WEIGHTS_SUFFIX}") if name in WEIGHT_NAMES else Path(which)
        if not path.exists():
            if name in WEIGHT_NAMES:
                have = [n for n in WEIGHT_NAMES if self.file(f"{n}{WEIGHTS_SUFFIX}").is_file()]
                raise FileNotFoundError(f"{self.path}: no {path.name}; this run has {', '.join(have) or 'no weights'}")
            hint = f" (or one of the run's: {', '.join(WEIGHT_NAMES)})" if not name.endswith(WEIGHTS_SUFFIX) else ""
            raise FileNotFoundError(f"--weights {name}: no such weights file{hint}")
        return _regular(path)

    @property
    def base(self) -> Run | None:
        """The run a fine-tuning run started from (``finetune.json``), or None."""
        path = self.file(FINETUNE_FILE)
        if not path.is_file():
            return None
        try:
            return Run(read_json(path, "fine-tuning record")["base_run"])
        except (DataError, KeyError, TypeError) as e:
            raise RunError(f"{path}: no base_run ({e})") from None

    @property
    def tokens_path(self) -> Path | None:
        """The tokenized pretraining corpus: the run's own ``tokens.bin``, else its base run's; None if neither."""
        run: Run | None = self
        while run is not None:
            if run.file(TOKENS_FILE).is_file():
                return run.file(TOKENS_FILE)
            run = run.base
        return None

    def step_weights(self) -> list[Path]:
        """The step checkpoints' weights (``step_N.safetensors``), oldest first."""
        return sorted(self.path.glob(f"{STEP_PREFIX}*{WEIGHTS_SUFFIX}"))

    # ------------------------------------------------------------------------------------------
    # One writer

    @contextlib.contextmanager
    def writing(self) -> Iterator[Run]:
        """Hold the run's one-writer lock while the block writes the run: a second writer (a second
        ``--resume``, an ``--overwrite`` or a fine-tuning into the same folder) is refused, in one line
        that names the holder. The lock is an ``flock`` on ``RUN/.writer.lock`` (:mod:`qkv.locks`), so
        the system lets go of it however the writer ends. Readers never take it. Once it holds the lock,
        the writer deletes the temporary files a killed writer left (:func:`qkv.files.left_behind_in`). A
        block that fails puts the lock file back as it found it (or removes it, and a folder it created for
        nothing): what a failed command leaves is the directory as it was.

        A job that holds the lock may call another that takes it (``qkv demo`` trains, then writes its
        figures): within one process the lock is taken once and held until the outermost block ends.

        Raises:
            RunError: another process is writing the run.
        """
        key = self.path.resolve()
        if key in _HELD:  # this process writes the run already (a job within a job)
            yield self
            return
        created = not self.path.exists()
        self.path.mkdir(parents=True, exist_ok=True)
        path = self.file(WRITER_LOCK)
        found = path.read_bytes() if path.is_file() else None  # who held the lock last, or no lock file yet
        with as_os_error(path):  # a full disk or a read-only folder names the file
            fd = locks.try_lock(path)
        if fd is None:
            who = locks.holder(path) or "a process that has not yet said which"
            raise RunError(f"{self.path} is being written by {who}; a run has one writer: wait for it to end, or "
                           "choose another --run directory")
        try:
            argv = [Path(sys.argv[0]).name, *sys.argv[1:]] if sys.argv and sys.argv[0] else ["python"]
            with as_os_error(path):
                locks.describe(fd, f"pid {os.getpid()} ({shlex.join(argv)})")
            # What a writer killed mid-save left, none writing now; but a checkpoint's own, which a resume
            # may finish the save with (training.checkpoint), and its next save clears.
            for temp in left_behind_in(self.path, keep=(f"{LAST}.pt", f"{LAST}{WEIGHTS_SUFFIX}")):
                with contextlib.suppress(OSError):
                    temp.unlink()
            _HELD.add(key)
            yield self
        except BaseException:
            # A writer that fails leaves the directory as it found it, byte for byte: its lock file too.
            locks.put_back(fd, path, found)
            raise
        finally:
            _HELD.discard(key)
            if created and {p.name for p in self.path.iterdir()} <= {WRITER_LOCK}:  # a start that wrote nothing
                path.unlink(missing_ok=True)
                self.path.rmdir()
            locks.release(fd)

    # ------------------------------------------------------------------------------------------
    # New, resume, overwrite

    def prepare(self, resume: bool = False, overwrite: bool = False) -> Run:
        """Make the directory ready for a job: continue it (``resume``), replace it (``overwrite``), or a new one.

        Raises:
            FileNotFoundError: ``resume`` without a checkpoint to continue.
            RunError: a new run in a directory that already holds one, without ``overwrite``; or one
                whose ``.replaced`` holds the old run of an ``--overwrite`` that was stopped.
        """
        if resume:
            if not self.has_checkpoint:
                raise FileNotFoundError(f"{self.path}: nothing to resume (no {LAST}.pt checkpoint)")
            return self
        existing = self._files()
        if not overwrite:
            self._check_nothing_set_aside()
            if existing:
                raise RunError(f"{self.path} already holds a run ({', '.join(p.name for p in existing[:4])}"
                               f"{', ...' if len(existing) > 4 else ''}); pass --resume to continue it, --overwrite to "
                               "start again, or choose another --run directory")
        for path in existing:
            shutil.rmtree(path) if path.is_dir() else path.unlink()
        self.path.mkdir(parents=True, exist_ok=True)
        return self

    @contextlib.contextmanager
    def starting(self, resume: bool = False, overwrite: bool = False) -> Iterator[Run]:
        """:meth:`prepare`, then the writing of a new run's first files (tokenizer, config, tokens) in the
        ``with`` block; if that fails (an empty corpus, a wrong tokenizer source), they go again: a run that
        never started would otherwise hold a ``config.json`` and refuse the corrected command without
        ``--overwrite``. A resumed run's files are never touched.

        With ``overwrite`` the old run is set aside in ``RUN/.replaced``, not deleted, until the new run's
        first files are written: a new run that cannot start (a mistyped corpus path) puts the old one back
        as it was. A process killed in between leaves it there, and the next start in the directory says so.
        """
        if resume:
            yield self.prepare(resume=True)
            return
        aside = self._set_aside() if overwrite else None
        self.prepare(overwrite=overwrite)
        try:
            yield self
        except BaseException:
            self.prepare(overwrite=True)
            if aside is not None:  # the old run, back where it was
                for path in aside.iterdir():
                    path.rename(self.file(path.name))
                aside.rmdir()
            raise
        if aside is not None:
            shutil.rmtree(aside)

    def _files(self) -> list[Path]:
        """The files of a run in the directory: what a new run replaces when asked to."""
        existing = [self.file(n) for n in _RUN_FILES if self.file(n).exists()]
        existing += self.step_weights() + sorted(self.path.glob("*.hyp"))
        existing += sorted(self.path.glob(f"{TOKENS_FILE}*"))
        return existing + ([self.file(TENSORBOARD_DIR)] if self.file(TENSORBOARD_DIR).is_dir() else [])

    def _set_aside(self) -> Path | None:
        """Move the run in the directory into ``RUN/.replaced`` (renames, on one filesystem); None if it holds none."""
        self._check_nothing_set_aside()
        existing = self._files()
        if not existing:
            return None
        aside = self.file(REPLACED_DIR)
        aside.mkdir()
        for path in existing:
            path.rename(aside / path.name)
        return aside

    def _check_nothing_set_aside(self) -> None:
        """A run set aside by an ``--overwrite`` that was stopped is the user's to take back or delete: no new
        start passes it by, or a later ``--overwrite`` would delete it for good. One that never trained (no
        weights, no checkpoint: a run that had not started, as a grid's interrupted variant) is deleted."""
        aside = self.file(REPLACED_DIR)
        if not aside.exists():
            return
        if any(p.name.endswith(WEIGHTS_SUFFIX) or p.name == f"{LAST}.pt" for p in aside.iterdir()):
            raise RunError(f"{aside} holds the run that an --overwrite of {self.path} was replacing when it was "
                           f"stopped: move its files back into {self.path} to keep that run, or delete {aside}; "
                           "then run the command again")
        shutil.rmtree(aside)


def _regular(path: Path) -> Path:
    """``path``, if it is a regular file (a link to one is): weights are never read from a folder or a device."""
    if not path.is_file():
        what = "a folder" if path.is_dir() else "a broken link" if not path.exists() else "not a regular file"
        raise RunError(f"{path} is {what}, not a weights file: remove it or put the run's weights there, or choose "
                       f"others with --weights ({', '.join(WEIGHT_NAMES)})")
    return path


F = TypeVar("F", bound=Callable[..., Any])


def one_writer(param: str) -> Callable[[F], F]:
    """Make a function that writes the run directory passed as its argument ``param`` hold the run's
    one-writer lock (:meth:`Run.writing`) for the whole call. Under torchrun only rank 0 takes it:
    the others write nothing to the run."""

    def decorate(fn: F) -> F:
        signature = inspect.signature(fn)

        @functools.wraps(fn)
        def holding(*args: Any, **kwargs: Any) -> Any:
            if launched_rank() != 0:
                return fn(*args, **kwargs)
            with Run(signature.bind(*args, **kwargs).arguments[param]).writing():
                return fn(*args, **kwargs)

        return holding  # type: ignore[return-value]

    return decorate


def load_model(run: Run | str | Path, weights: str | Path | None = None,
               device: str | torch.device | None = "auto") -> tuple[nn.Module, Tokenizer]:
    """The model of a run with its weights, in eval mode on ``device``, and its tokenizer.

    Args:
        run: A :class:`Run` or its path.
        weights: ``model``, ``best``, ``last``, ``average`` or a ``.safetensors`` path (default: see
            :meth:`Run.weights_path`).
        device: ``auto`` (CUDA when present), ``cpu``, ``cuda``...

    Raises:
        FileNotFoundError: the directory or one of its files is missing (each is named).
        RunError: files that do not belong together.
        DeviceError: a device that is not there.
    """
    run = Run.of(run)
    device = resolve_device(device)
    kind = KINDS[run.arch]  # config.json first: a missing directory or config is named as such, before the other files
    missing = [] if run.file(TOKENIZER_FILE).is_file() else [TOKENIZER_FILE]
    try:
        path = run.weights_path(weights)
    except FileNotFoundError as e:
        if not missing:
            raise
        missing.append(str(e).split(": ", 1)[-1])
    if missing:
        raise FileNotFoundError(f"{run.path}: missing {' and '.join(missing)}; a run holds {CONFIG_FILE}, "
                                f"{TOKENIZER_FILE} and its weights")
    model = kind.model(run.model_config)
    tokenizer = run.tokenizer()
    tensors, _ = read_weights(path)  # a damaged file is its own error (CheckpointError), not a mismatch
    try:
        load_state_dict_into(model, tensors, source=str(path))
    except NonFiniteWeights:
        raise
    except CheckpointError as e:
        raise RunError(f"{e} (the weights do not match {run.file(CONFIG_FILE)}: files from different runs?)") from None
    return model.to(device).eval(), tokenizer


def require_arch(run: Run, arch: str, command: str, instead: str | None = None) -> None:
    """A clear error when ``run`` holds the other kind of model than ``command`` needs.

    Args:
        instead: The command that does the same with the run's own kind (``qkv generate`` for
            ``qkv translate``), named in the error.
    """
    if run.arch != arch:
        kind = "an encoder-decoder" if arch == "transformer" else "a GPT"
        what = "a translation run" if run.arch == "transformer" else "a GPT run"
        hint = f"; this is {what}: use {instead}" if instead else ""
        raise RunError(f"{run.path} holds a {run.arch!r} model, not {kind}; {command} needs a run of "
                       f"{KINDS[arch].made_by}{hint}")


__all__ = [
    "Run", "RunError", "one_writer", "WRITER_LOCK", "load_model", "require_arch", "WEIGHT_NAMES", "CONFIG_FILE", "TOKENIZER_FILE",
    "METRICS_FILE", "TENSORBOARD_DIR", "CURVES_FILE", "RESULTS_FILE", "FINETUNE_FILE", "FINISHED_FILE", "ADAPTER_FILE", "LAST", "STEP_PREFIX",
    "PRONOUNS_JSON", "PRONOUNS_PNG",
    "MODEL_WEIGHTS_NAME", "BEST_WEIGHTS_NAME",
    "TOKENS_FILE", "WEIGHTS_SUFFIX",
]
