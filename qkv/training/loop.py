"""The pieces every training recipe is made of, written once: its ``train:`` knobs, the start of a run, one
optimizer step, the cadence of evaluations and checkpoints, resume and export.

Translation (:mod:`qkv.training.train_mt`), GPT pretraining (:mod:`qkv.training.train_lm`) and
fine-tuning (:mod:`qkv.training.finetune`) are each one function that reads top to bottom, built from
these, so they agree by construction:

- :class:`~qkv.recipes.LoopConfig`: the ``train:`` knobs every recipe has (it lives in :mod:`qkv.recipes` with
  every recipe's shape, where the readers of a run find it; imported here for the trainers).
- :func:`start`: threads, seeds, the device and the precision, into a :class:`Runtime`. The runtime
  also says which process of a group this is (one process: rank 0 of 1; under torchrun it joins the
  group, see :mod:`qkv.training.distributed`), and wraps the model for data-parallel training.
- :func:`optimizer_step`: the one update of every recipe. Before it touches the weights it checks
  that the loss and the gradient norm are finite, at every step: a NaN never reaches the weights, so
  it never reaches a checkpoint. :func:`update` calls it under ``train.on_nonfinite`` (stop the run,
  or skip the batch and go on).
- :class:`Cadence`: when a step logs, evaluates and checkpoints, and when the run ends (the step
  budget, or the time budget).
- :func:`save_state` / :func:`resume_state`: the ``last`` checkpoint (weights, optimizer, RNGs, the
  :class:`LoopState` and each data stream's position), so a resumed run continues exactly.
- :func:`accumulate` and :func:`rank_share`: a step's forward and backward over its micro-batches, DDP's
  gradient sync after the last only, and the weight of a rank's loss that makes DDP's mean of the ranks'
  gradients the whole step's gradient.
- :func:`export`: the weights a run is used with (``model.safetensors``), refused if not finite.
- :class:`TrainResult`: what every trainer returns.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np
import torch
from torch import nn

from qkv.errors import ConfigError
from qkv.settings import to_dict
from qkv.devices import autocast_dtype, keep_freed_memory, resolve_device
from qkv.parallel import SINGLE, Ranks
from qkv.recipes import LoopConfig
from qkv.files import write_json
from qkv.runs import LAST, MODEL_WEIGHTS_NAME, Run
from qkv.training import distributed
from qkv.training.checkpoint import capture_rng_state, load_checkpoint, restore_rng_state, save_checkpoint
from qkv.training.logging import MetricsLogger, NonFiniteLossError, check_finite
from qkv.weights import save_weights


@dataclass(frozen=True)
class Runtime:
    """Where and how a run computes: its device, its autocast dtype (None: fp32), and its place among the ranks.

    One process is rank 0 of 1. Only the main process writes the run directory (metrics, checkpoints,
    exports, plots); every process reads the same checkpoint on resume.
    """

    device: torch.device
    amp: torch.dtype | None = None
    ranks: Ranks = SINGLE
    seed: int = 0
    scaler: torch.amp.GradScaler | None = None  # fp16 only: scales the loss so small gradients survive

    @property
    def rank(self) -> int:
        return self.ranks.rank

    @property
    def world_size(self) -> int:
        return self.ranks.world_size

    @property
    def is_main(self) -> bool:
        return self.ranks.is_main

    def backward(self, loss: torch.Tensor) -> None:
        """``loss.backward()``, through the gradient scaler when training in fp16."""
        (loss if self.scaler is None else self.scaler.scale(loss)).backward()

    def wrap(self, model: nn.Module) -> nn.Module:
        """The module a training step calls: ``model`` itself, or ``model`` in DDP when there are several ranks.

        From here on each rank draws its own dropout masks (rank r reseeds with ``seed + r``; rank 0
        keeps the stream a single process would have). Evaluations and checkpoints use ``model``.
        """
        if self.ranks.group is None:
            return model
        wrapped = distributed.wrap(model, self.ranks.group, self.device)
        if self.rank > 0:
            torch.manual_seed(self.seed + self.rank)
        return wrapped


def compiled(module: nn.Module, cfg: LoopConfig) -> nn.Module:
    """``module`` through ``torch.compile`` when the recipe asks (``train.compile``), else itself."""
    return torch.compile(module) if cfg.compile else module


def start(cfg: LoopConfig, group: Any = None) -> Runtime:
    """Set the threads and seed every generator (torch, Python, NumPy) from ``cfg``; resolve device and precision.

    Under torchrun the process joins its group here (gloo on CPUs, nccl on GPUs) and takes its own GPU.
    On CUDA, float32 matrix products may use TF32 (as the bf16 autocast, a precision for speed). The C
    allocator keeps freed memory for the next step's tensors (:func:`qkv.devices.keep_freed_memory`).

    Args:
        cfg: The recipe's ``train:`` section.
        group: A ``torch.distributed`` process group the run is one rank of (None: the one torchrun
            describes, if it started this process; else a single process).

    Raises:
        DeviceError: ``cfg.device`` is not there (``cuda`` on a machine without CUDA), or the
            distributed backend it needs is missing.
        ValueError: bf16 asked for on a CPU.
    """
    device = distributed.local_device(resolve_device(cfg.device))
    amp = autocast_dtype(cfg.dtype, device)
    if group is None:
        group = distributed.join(device)
    if cfg.threads > 0:
        torch.set_num_threads(cfg.threads)
    keep_freed_memory()
    if device.type == "cuda":
        torch.set_float32_matmul_precision("high")
    torch.manual_seed(cfg.seed)
    random.seed(cfg.seed)
    np.random.seed(cfg.seed % 2**32)
    scaler = torch.amp.GradScaler(device.type) if amp == torch.float16 else None
    return Runtime(device, amp, Ranks(group), cfg.seed, scaler)


# ----------------------------------------------------------------------------------------------
# One update


def optimizer_step(optimizer: torch.optim.Optimizer, loss: torch.Tensor | float, step: int, clip_norm: float,
                   parameters: Iterable[nn.Parameter], scaler: torch.amp.GradScaler | None = None) -> float:
    """Clip and apply the gradients accumulated for ``step``, after checking that they are finite.

    With an fp16 gradient ``scaler``, a non-finite gradient is the scale overflowing, not the model
    diverging: the update is skipped and the scale lowered (as ``GradScaler`` means to be used).

    Args:
        optimizer: Its learning rate already set for this step.
        loss: The step's loss (its mean over the accumulated batches), for the finite check and the log.
        step: The step number, for the error message.
        clip_norm: Clip the global gradient norm to this (0: no clipping; the norm is still checked).
        parameters: The parameters that train (their gradients are clipped and checked).
        scaler: The runtime's gradient scaler (fp16 only).

    Returns:
        The loss as a float.

    Raises:
        NonFiniteLossError: a NaN or infinite loss or gradient; the weights are left as they were.
    """
    value = check_finite(loss, step)  # before the update: never step on a NaN
    params = [p for p in parameters if p.grad is not None]
    if scaler is not None:
        scaler.unscale_(optimizer)
    # The norm is computed either way (it is the finite check); the gradients are scaled only to clip.
    norm = torch.nn.utils.get_total_norm([p.grad for p in params])
    if scaler is not None and not torch.isfinite(norm):
        scaler.step(optimizer)  # skips the update: unscale_ found the infinities
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        return value
    if not torch.isfinite(norm):
        optimizer.zero_grad(set_to_none=True)
        raise NonFiniteLossError(
            f"the gradient norm is {float(norm)} at step {step} (the loss, {value:.4g}, is finite): training "
            "stopped before updating on it. Lower the learning rate or lengthen warmup.")
    if clip_norm > 0:
        torch.nn.utils.clip_grads_with_norm_(params, clip_norm, norm)
    if scaler is None:
        optimizer.step()
    else:
        scaler.step(optimizer)
        scaler.update()
    optimizer.zero_grad(set_to_none=True)
    return value


def update(cfg: LoopConfig, state: LoopState, runtime: Runtime, optimizer: torch.optim.Optimizer,
           loss: torch.Tensor, parameters: Iterable[nn.Parameter], metrics: MetricsLogger) -> float | None:
    """The step's :func:`optimizer_step` under ``train.on_nonfinite``: the step's loss, or None if its batch
    was skipped.

    Every rank decides alike: the loss is the sum over the ranks and the gradients are all-reduced, so
    they are non-finite on all ranks or on none. A skipped batch is a ``skipped`` line in metrics.jsonl;
    the counts are in the :class:`LoopState`, so a resumed run skips as the uninterrupted one would.

    Raises:
        NonFiniteLossError: with ``stop``, or when ``max_skips`` batches in a row were skipped.
    """
    try:
        value = optimizer_step(optimizer, loss, state.step, cfg.clip_norm, parameters, runtime.scaler)
    except NonFiniteLossError as e:
        optimizer.zero_grad(set_to_none=True)  # the bad batch's gradients go with it
        kept = (f"Kept: the checkpoint of step {state.checkpoint_step}; --resume continues from it once the cause is "
                "fixed." if state.checkpoint_step else "No checkpoint was saved yet: start the run again.")
        if cfg.on_nonfinite == "stop":
            raise NonFiniteLossError(f"{e} {kept}") from None
        if state.skipped_in_a_row >= cfg.max_skips:
            raise NonFiniteLossError(f"{e} ({cfg.max_skips} batches in a row were skipped before it: "
                                     f"train.max_skips) {kept}") from None
        state.skipped += 1
        state.skipped_in_a_row += 1
        metrics.log(state.step, "skipped", reason=str(e).split(":")[0], in_a_row=state.skipped_in_a_row)
        return None
    state.skipped_in_a_row = 0
    return value


# ----------------------------------------------------------------------------------------------
# Cadence


def rank_share(own: float, whole: float, ranks: Ranks) -> float:
    """The weight of this rank's mean loss over its ``own`` units of a step (target or response tokens, windows)
    out of the step's ``whole``: ``own / whole`` times the ranks, since DDP averages the ranks' gradients. Each
    rank's weighted loss then has for gradient its part of the whole step's, and the update is the one that one
    process makes on the whole step, however the units fall to the ranks and the micro-batches."""
    return own / max(whole, 1.0) * ranks.world_size


def accumulate(module: nn.Module, runtime: Runtime, micro_batches: int, loss_of: Callable[[int], torch.Tensor]) -> None:
    """Forward and backward over a step's ``micro_batches``: ``loss_of(i)`` runs the i-th forward and returns its
    loss, weighted (:func:`rank_share`); DDP (``module``) syncs the gradients after the last one only
    (``no_sync`` before it, forward included, as DDP requires)."""
    for i in range(micro_batches):
        with distributed.synced(module, last=i == micro_batches - 1):
            runtime.backward(loss_of(i))


@dataclass
class TrainResult:
    """What a trainer did: :func:`~qkv.training.train_mt.train`, :func:`~qkv.training.train_lm.train_lm` and
    :func:`~qkv.training.finetune.finetune` each return one.

    Attributes:
        run_dir: The run directory.
        step: The last step completed.
        train_seconds: Training time of the run so far, its optimizer steps (a resumed run's add up).
        losses: The training loss of every step this call ran, in order (skipped batches have none).
        valid: The last evaluation during training, named as in ``metrics.jsonl`` (empty if none ran).
        best: The best validation score of the run, lower is better (a BLEU is stored negated).
        final: The evaluation at the end, of the weights the run exports (empty if it stopped early): a GPT's
            full pass over its validation split, a translator's test scores, a fine-tuning's task and
            pretraining losses.
        summary: What the job reports: ``results.json`` where it writes one, and what its command prints.
    """

    run_dir: Path
    step: int = 0
    train_seconds: float = 0.0
    losses: list[float] = field(default_factory=list)
    valid: dict[str, float] = field(default_factory=dict)
    best: float = math.inf
    final: dict[str, Any] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)


@dataclass
class LoopState:
    """What a loop counts, saved in every checkpoint: the step done, training time, the best score so far.

    ``best`` is lower-is-better (a loss; a BLEU is stored negated); ``bad_evals`` counts the evaluations
    since it last improved (early stopping); ``skipped`` the batches skipped for a non-finite loss or
    gradient (``train.on_nonfinite: skip``), ``skipped_in_a_row`` those since the last update;
    ``checkpoint_step`` the step of the last checkpoint (0: none yet), which a stop message names.
    """

    step: int = 0
    seconds: float = 0.0
    best: float = math.inf
    bad_evals: int = 0
    skipped: int = 0
    skipped_in_a_row: int = 0
    checkpoint_step: int = 0

    def improve(self, score: float) -> bool:
        """Record an evaluation's ``score``; True if it is the best so far (a non-finite one never is)."""
        if math.isfinite(score) and score < self.best:
            self.best, self.bad_evals = score, 0
            return True
        self.bad_evals += 1
        return False

    def state_dict(self) -> dict[str, Any]:
        return asdict(self)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        for f in fields(self):  # a checkpoint from before a count existed: the count starts at its default
            setattr(self, f.name, type(getattr(self, f.name))(state.get(f.name, f.default)))


class Cadence:
    """When each step logs, evaluates and checkpoints, and when the run stops.

    The run ends at ``cfg.steps``, or at the first step that ends past ``cfg.max_minutes`` of
    training time; either way the last step evaluates and checkpoints, so an export always follows a
    checked, saved step.
    """

    def __init__(self, cfg: LoopConfig, state: LoopState) -> None:
        self.cfg, self.state = cfg, state
        self._budget = None if cfg.max_minutes is None else cfg.max_minutes * 60
        self._t0 = None

    def running(self, stop_at: int | None = None) -> bool:
        """Whether another step is due (``stop_at``: stop after that step, as if interrupted)."""
        interrupted = stop_at is not None and self.state.step >= stop_at
        return self.state.step < self.cfg.steps and not self.out_of_time and not interrupted

    def begin_step(self) -> int:
        """Start the next step; returns its number."""
        self._t0 = time.perf_counter()
        self.state.step += 1
        return self.state.step

    def end_step(self) -> None:
        """Add the step's time to the training time."""
        self.state.seconds += time.perf_counter() - self._t0

    @property
    def out_of_time(self) -> bool:
        return self._budget is not None and self.state.seconds >= self._budget

    @property
    def last(self) -> bool:
        """The step just done is the run's last (its step budget or time budget is spent)."""
        return self.state.step >= self.cfg.steps or self.out_of_time

    @property
    def log_due(self) -> bool:
        return self.state.step % self.cfg.log_every == 0 or self.last

    @property
    def eval_due(self) -> bool:
        return self.state.step % self.cfg.eval_every == 0 or self.last

    @property
    def stop_reason(self) -> str:
        return "max_minutes" if self.out_of_time and self.state.step < self.cfg.steps else "max_steps"


# ----------------------------------------------------------------------------------------------
# Checkpoints and export


def _check_weights_finite(model: nn.Module, what: str) -> None:
    for name, p in model.state_dict().items():
        if p.is_floating_point() and not bool(torch.isfinite(p).all()):
            raise NonFiniteLossError(f"{name} holds NaN or infinite values: the {what} was not written "
                                     "(the files on disk are the last good ones)")


def save_state(run_dir: str | Path, model: nn.Module, optimizer: torch.optim.Optimizer, state: LoopState,
               runtime: Runtime, extra: Mapping[str, Any] | None = None, metrics: MetricsLogger | None = None,
               **streams: Any) -> None:
    """Write the ``last`` checkpoint: weights, optimizer, RNGs, ``state``, each data stream's ``state_dict()``,
    the recipe's own ``extra`` values (numbers, strings, tensors) and how many lines ``metrics`` holds.

    Every rank calls it (each one's random state is kept, for its own dropout); only the main process
    writes. Weights that are not finite are never written.
    """
    _check_weights_finite(model, "checkpoint")  # the same weights on every rank: they all stop, or none
    state.checkpoint_step = state.step  # on every rank, so that each names the same checkpoint
    ranks_rng = runtime.ranks.collect([capture_rng_state()], runtime.world_size) if runtime.world_size > 1 else None
    if not runtime.is_main:
        return
    save_checkpoint(run_dir, LAST, model, optimizer, {
        **(extra or {}), "loop": state.state_dict(), **{name: stream.state_dict() for name, stream in streams.items()},
        **({"rng_ranks": ranks_rng} if ranks_rng else {}),
        **({"grad_scaler": runtime.scaler.state_dict()} if runtime.scaler is not None else {}),
        **({"metrics_lines": metrics.lines} if metrics is not None else {}),
    })


# Settings of those sections that a resumed run may change: where the corpus is found, the split scored
# at the end, the text an empty prompt starts from. None of them is what the checkpoint learned from.
FREE_ON_RESUME = ("data.data_dir", "data.test", "data.start")


def fixed_settings(recipe: Any, sections: Sequence[str] = ("model", "data")) -> dict[str, Any]:
    """The settings of a recipe that its run's checkpoint fixes, by dotted name: its model, and the data
    its saved position counts in (less :data:`FREE_ON_RESUME`)."""
    settings = to_dict(recipe)
    named = {f"{section}.{key}": value for section in sections for key, value in settings[section].items()}
    return {name: value for name, value in named.items() if name not in FREE_ON_RESUME}


def check_same_run(saved: Mapping[str, Any], resumed: Mapping[str, Any]) -> None:
    """``--resume`` continues a run as it was. A fixed setting (:func:`fixed_settings`) that differs from
    the run's own is one error that names it, raised before the run's record is written again: written, it
    would describe a run the checkpoint is not, and a ``config.json`` that no longer fits its checkpoint
    leaves a run that no plain ``--resume`` can load. Other settings may change (``train.steps=N`` goes on
    further). A setting the run's record does not hold (written before the setting existed) is not checked."""
    changed = [f"{name}={value!r} (the run's: {saved[name]!r})" for name, value in resumed.items()
               if name in saved and value != saved[name]]
    if changed:
        raise ConfigError(f"--resume continues a run as it was, and {'; '.join(changed)} would make it another "
                          "run: start a new one for that (--resume takes changes such as train.steps=N)")


def resume_state(run_dir: str | Path, model: nn.Module, optimizer: torch.optim.Optimizer, state: LoopState,
                 runtime: Runtime | None = None, metrics: MetricsLogger | None = None,
                 record: Mapping[str, Any] | None = None, **streams: Any) -> dict[str, Any]:
    """Load the ``last`` checkpoint into ``model``, ``optimizer``, ``state`` and each stream; return the whole
    saved state (for what a recipe kept of its own).

    Only then, everything the resume continues from read and checked, does the resume write: ``metrics`` is
    cut back to the lines it held at the checkpoint (what was logged after it is logged again by the resumed
    run, so the file equals an uninterrupted run's line for line), the files of ``record`` (a file name and
    its JSON: the run's config.json, with the settings a resume may change) are written, and the run is no
    longer finished (:meth:`~qkv.runs.Run.unfinish`). So a resume that fails (weights of another model, a
    checkpoint that is damaged or gone) leaves the run as it was, byte for byte.

    Each rank takes back its own random state when the checkpoint was written by as many ranks; else
    rank 0's, and ranks above reseed by rank and step.
    """
    saved = load_checkpoint(run_dir, LAST, model, optimizer)
    if "loop" not in saved:  # a checkpoint written before the trainers shared this loop
        best = saved.get("best_valid", saved.get("best"))
        saved["loop"] = {"step": saved["step"], "seconds": saved.get("elapsed", saved.get("train_seconds", 0.0)),
                         "best": math.inf if best is None else best, "bad_evals": saved.get("bad_evals", 0)}
    state.load_state_dict(saved["loop"])
    for name, stream in streams.items():
        stream.load_state_dict(saved[name])
    if runtime is not None and runtime.scaler is not None and "grad_scaler" in saved:
        runtime.scaler.load_state_dict(saved["grad_scaler"])
    if runtime is not None and runtime.rank > 0:
        per_rank = saved.get("rng_ranks")
        if per_rank and len(per_rank) == runtime.world_size:
            restore_rng_state(per_rank[runtime.rank])
        else:
            torch.manual_seed(runtime.seed + runtime.rank + 1_000_003 * state.step)
    if metrics is not None and "metrics_lines" in saved:
        metrics.rewind(int(saved["metrics_lines"]))
    if runtime is None or runtime.is_main:
        for name, data in (record or {}).items():
            write_json(Path(run_dir) / name, data)
        Run(run_dir).unfinish()
    return saved


def export(run_dir: str | Path, model: nn.Module, runtime: Runtime, **metadata: Any) -> Path | None:
    """Write ``model.safetensors``, the weights the run is used with; refused if they are not finite."""
    if not runtime.is_main:
        return None
    _check_weights_finite(model, "export")
    return save_weights(Path(run_dir) / MODEL_WEIGHTS_NAME, model, metadata={k: str(v) for k, v in metadata.items()})


__all__ = ["Runtime", "start", "compiled", "optimizer_step",
           "update", "LoopState", "Cadence", "save_state", "resume_state", "fixed_settings", "check_same_run",
           "export"]
