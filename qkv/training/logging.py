"""Training telemetry: metrics as JSON lines in the run directory, progress on stderr, and a NaN guard.

``metrics.jsonl`` holds one JSON object per event (``step``, ``split``, ``time``, ``elapsed`` and the
values), flushed line by line so a crash loses nothing already logged. With ``train.logger:
tensorboard`` the same numbers also go to TensorBoard events in ``tensorboard/`` (a tag per split and
value: ``train/loss``, ``valid/bleu``), through torch's own ``SummaryWriter``. Progress goes to stderr twice:
a tqdm bar when stderr is a terminal, and plain periodic lines always, so that a log file of a run
without a terminal (a job scheduler, ``2> log``) still shows how it went.
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path
from typing import Any, TextIO

import torch

from qkv.errors import QkvError, require
from qkv.files import as_os_error, write_text
from qkv.recipes import LOGGERS
from qkv.runs import METRICS_FILE, TENSORBOARD_DIR

_RESERVED = ("step", "split", "time", "elapsed")


class NonFiniteLossError(QkvError, FloatingPointError):
    """The loss became NaN or infinite: training on it would destroy the weights."""


def check_finite(loss: torch.Tensor | float, step: int) -> float:
    """Return ``loss`` as a float, or raise :class:`NonFiniteLossError` if it is NaN or infinite.

    Calling it reads the loss on the host (a device sync on GPU); a trainer may call it at its
    logging interval rather than every step, as long as it is before the weights are saved.

    Args:
        loss: Scalar tensor or number.
        step: The step the loss belongs to, for the message.
    """
    value = float(loss.detach().float().item() if isinstance(loss, torch.Tensor) else loss)
    if not math.isfinite(value):
        raise NonFiniteLossError(
            f"loss is {value} at step {step}: training stopped before updating on it. Usual causes: a "
            "learning rate too high (lower it or lengthen warmup), fp16 overflow (use bf16 or a grad "
            "scaler), or a batch with no target token."
        )
    return value


def _jsonable(value: Any, key: str) -> Any:
    if isinstance(value, torch.Tensor):
        return value.item() if value.numel() == 1 else value.tolist()
    if hasattr(value, "item") and type(value).__module__ == "numpy":
        return value.item()
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_jsonable(v, key) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v, f"{key}.{k}") for k, v in value.items()}
    raise TypeError(f"MetricsLogger: value of {key!r} is a {type(value).__name__}, not a number, string or list")


class TensorBoardEvents:
    """The scalars of each event as TensorBoard summaries: tag ``split/name``, at the event's step.

    The writer opens at the first event, so that a resumed run first says where it took up:
    ``purge_step`` makes TensorBoard drop what an interrupted run had logged after its checkpoint,
    which the resumed run logs again (as ``metrics.jsonl`` is cut back to the checkpoint's lines).
    """

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._summary = require("torch.utils.tensorboard", "tensorboard", "train.logger: tensorboard",
                                package="tensorboard")
        self._writer = None
        self.purge_step: int | None = None

    def add(self, record: dict[str, Any]) -> None:
        values = {k: v for k, v in record.items() if k not in _RESERVED and isinstance(v, (int, float))
                  and not isinstance(v, bool)}
        if not values:
            return
        if self._writer is None:
            self._writer = self._summary.SummaryWriter(str(self.folder), purge_step=self.purge_step)
        for name, value in values.items():
            self._writer.add_scalar(f"{record['split']}/{name}", value, record["step"], walltime=record["time"])
        self._writer.flush()  # as metrics.jsonl: what was logged is on disk

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


class MetricsLogger:
    """Append one JSON object per event to ``run_dir/metrics.jsonl`` (and to TensorBoard, if asked).

    Example:
        >>> log = MetricsLogger("runs/demo")  # doctest: +SKIP
        >>> log.log(100, "train", loss=3.2, lr=4e-4, tokens_per_s=1200)  # doctest: +SKIP

    Args:
        run_dir: The run directory (created if needed). An existing file is appended to, so a resumed
            run continues the same file; :meth:`rewind` first cuts it back to the checkpoint's lines.
        enabled: False makes every call a no-op (ranks other than 0 in distributed training).
        logger: ``jsonl``, or ``tensorboard`` for TensorBoard events as well (``LOGGERS``; needs the
            ``tensorboard`` extra).
    """

    def __init__(self, run_dir: str | Path, enabled: bool = True, logger: str = LOGGERS[0]) -> None:
        self.path = Path(run_dir) / METRICS_FILE
        self.enabled = enabled
        self._start = time.time()
        # The file is opened for each line and closed at once: no handle outlives a run that failed
        # (a handle kept in an exception's frames would hold the file, and the disk, until gc).
        self._writing = enabled
        self.lines = 0  # complete lines in the file: what a checkpoint records (see rewind)
        self.tensorboard = TensorBoardEvents(Path(run_dir) / TENSORBOARD_DIR) if (
            enabled and logger == "tensorboard") else None
        if enabled:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if self.path.is_file():
                self.lines = self.path.read_bytes().count(b"\n")
            else:
                self.path.touch()  # there from the start, as a run's other files are

    def rewind(self, lines: int) -> None:
        """Keep only the first ``lines`` lines (those a checkpoint saw), so that a resumed run's file equals an
        uninterrupted run's line for line: what was logged after the checkpoint is logged again."""
        if not self._writing:
            return
        data = self.path.read_bytes()
        kept = data.split(b"\n")[:lines]
        if self.tensorboard is not None:
            self.tensorboard.purge_step = json.loads(kept[-1])["step"] + 1 if lines and kept[-1] else 0
        if lines >= self.lines and data.endswith(b"\n"):
            return
        write_text(self.path, b"".join(line + b"\n" for line in kept).decode("utf-8"))
        self.lines = len(kept)

    def log(self, step: int, split: str, /, **values: Any) -> dict[str, Any]:
        """Write one event and flush it.

        Args:
            step: Optimizer step the values belong to.
            split: ``"train"``, ``"valid"``, ``"test"``...
            **values: Numbers (tensors and NumPy scalars are converted), strings, lists.

        Returns:
            The record written.
        """
        for k in values:
            if k in _RESERVED:
                raise ValueError(f"MetricsLogger.log: {k!r} is reserved; pick another name for that value")
        now = time.time()
        record = {"step": int(step), "split": split, "time": round(now, 3), "elapsed": round(now - self._start, 3)}
        record.update({k: _jsonable(v, k) for k, v in values.items()})
        if self._writing:
            # NaN/inf are written as the bare words NaN/Infinity, which Python's json reads back.
            with as_os_error(self.path), open(self.path, "a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")
            self.lines += 1
            if self.tensorboard is not None:
                self.tensorboard.add(record)
        return record

    def close(self) -> None:
        """End the log; later :meth:`log` calls only return their record."""
        self._writing = False
        if self.tensorboard is not None:
            self.tensorboard.close()

    def __enter__(self) -> MetricsLogger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """Read a ``metrics.jsonl``; a truncated last line (a crash mid-write) is skipped, other bad lines are errors."""
    path = Path(path)
    lines = path.read_text(encoding="utf-8").splitlines()
    records = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as e:
            if i == len(lines):
                break
            raise ValueError(f"{path}:{i}: not a JSON object ({e.msg})") from e
    return records


def format_duration(seconds: float) -> str:
    """``3725`` -> ``"1:02:05"``; ``"?"`` when unknown."""
    if not math.isfinite(seconds) or seconds < 0:
        return "?"
    s = int(round(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


class Progress:
    """Training progress on stderr: a tqdm bar (terminals only) and plain lines every N steps or seconds.

    Example:
        >>> progress = Progress(total=1000)  # doctest: +SKIP
        >>> for step in range(1, 1001):  # doctest: +SKIP
        ...     progress.update(step, loss=loss, lr=lr, tokens=n_tokens)
        >>> progress.close()  # doctest: +SKIP

    Args:
        total: Last step of the run.
        desc: Label at the start of the bar and of each line.
        log_every: Write a plain line every this many steps (0: never by count).
        log_seconds: ...and whenever this many seconds have passed since the last one (0: never by time).
        start_step: Step already reached (a resumed run), so rates and ETA count from here.
        seconds_left: A time budget left at the start (``max_minutes``): the ETA is never beyond it.
        stream: Where to write; stderr by default.
        enabled: False makes every call a no-op (ranks other than 0).
    """

    def __init__(
        self,
        total: int,
        desc: str = "train",
        log_every: int = 100,
        log_seconds: float = 60.0,
        start_step: int = 0,
        seconds_left: float | None = None,
        stream: TextIO | None = None,
        enabled: bool = True,
    ) -> None:
        self.total = total
        self.desc = desc
        self.log_every = log_every
        self.log_seconds = log_seconds
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled
        self.step = start_step
        self._start_step = start_step
        self.seconds_left = seconds_left
        self._t0 = self._last_t = time.perf_counter()
        self._last_postfix_t = float("-inf")
        self._tokens_since = 0
        self._tokens_per_s = float("nan")
        self.bar = None
        if enabled:
            from tqdm import tqdm

            # disable=None: no bar when the stream is not a terminal (the plain lines remain).
            self.bar = tqdm(
                total=total, initial=start_step, desc=desc, file=self.stream, disable=None, dynamic_ncols=True
            )
        if start_step:  # every trainer's resume says where it took up
            self.write(f"{desc}: resumed from the last checkpoint, step {start_step} of {total}")

    @property
    def eta_seconds(self) -> float:
        """Seconds left at the mean pace since the start, or of the time budget if sooner (NaN before the first step)."""
        done = self.step - self._start_step
        if done <= 0:
            return float("nan")
        spent = time.perf_counter() - self._t0
        by_steps = spent / done * (self.total - self.step)
        return by_steps if self.seconds_left is None else max(0.0, min(by_steps, self.seconds_left - spent))

    def write(self, message: str) -> None:
        """Write a line without breaking the bar."""
        if not self.enabled:
            return
        if self.bar is not None and not self.bar.disable:
            self.bar.write(message, file=self.stream)
        else:
            print(message, file=self.stream, flush=True)

    def update(self, step: int, loss: float | torch.Tensor | None = None, lr: float | None = None, tokens: int = 0) -> None:
        """Record that ``step`` is done, having consumed ``tokens`` tokens.

        Args:
            step: The step just completed (absolute, not an increment).
            loss: Its loss (a tensor is read on the host only when something is displayed).
            lr: Its learning rate.
            tokens: Tokens processed since the previous update.
        """
        if not self.enabled:
            return
        advanced = step - self.step
        self.step = step
        self._tokens_since += int(tokens)
        now = time.perf_counter()
        show_bar = self.bar is not None and not self.bar.disable
        if show_bar:
            self.bar.update(advanced)
        plain = (
            (self.log_every > 0 and step % self.log_every == 0)
            or (self.log_seconds > 0 and now - self._last_t >= self.log_seconds)
            or step >= self.total
        )
        # The postfix is refreshed at most twice a second: reading a GPU loss forces a device sync.
        postfix = show_bar and now - self._last_postfix_t >= 0.5
        if not (plain or postfix):
            return
        if now > self._last_t and self._tokens_since:
            # Throughput over the window since the last plain line: current speed, not a lifetime mean.
            self._tokens_per_s = self._tokens_since / (now - self._last_t)
        fields = {}
        if loss is not None:
            fields["loss"] = f"{float(loss):.4f}"
        if lr is not None:
            fields["lr"] = f"{lr:.3e}"
        if math.isfinite(self._tokens_per_s):
            fields["tok/s"] = f"{self._tokens_per_s:,.0f}"
        fields["eta"] = format_duration(self.eta_seconds)
        if show_bar:
            self.bar.set_postfix(fields)
            self._last_postfix_t = now
        if plain:
            parts = [f"{self.desc} step {step}/{self.total}"] + [f"{k} {v}" for k, v in fields.items()]
            self.write(" | ".join(parts))
            self._last_t, self._tokens_since = now, 0

    def close(self) -> None:
        """Close the bar."""
        if self.bar is not None:
            self.bar.close()
            self.bar = None
