"""int8 decoding: the linear maps of a model quantized once, as it is loaded, for CPU inference.

A decoding step on a CPU is bound by reading its weights (qkv.accel.kernels): int8 weights are a
quarter of fp32's bytes. This is PyTorch's dynamic quantization (``torch.ao.quantization``): each
``nn.Linear`` becomes a quantized one whose weight is int8 with one scale per output row
(per-channel, which loses less than one scale per matrix), and whose input is quantized on the fly,
row by row of the batch, at every call; products accumulate in int32 (FBGEMM's kernels on x86,
QNNPACK's on ARM). Everything else stays fp32: embeddings, LayerNorms, attention over the cache. The
model is transformed from outside, like every speed-up of decoding; the paper's modules do not know.

The cost in quality is measured, not assumed: BLEU of Multi30K test2016 in fp32 and int8
(bench/int8_quality.py, docs/BENCHMARKS.md). PyTorch has marked ``torch.ao.quantization``
deprecated in favour of torchao, whose CPU int8 linear ran slower than fp32 in eager mode on the
pinned torch (docs/BENCHMARKS.md, "int8"), so qkv keeps the kernels that are fast today and silences
the notice.
"""

from __future__ import annotations

import copy
import warnings

import torch
from torch import Tensor, nn

from qkv.accel.swap import swap_modules
from qkv.errors import ConfigError
from qkv.devices import model_device

KINDS = ("int8",)


def check_quantize(kind: str | None, device: torch.device, compile: bool = False) -> None:
    """One clear line, before any work, where ``kind`` cannot be used here."""
    if kind is None:
        return
    if kind not in KINDS:
        raise ConfigError(f"--quantize {kind}: expected one of {', '.join(KINDS)}")
    if device.type != "cpu":
        raise ConfigError(f"--quantize {kind} runs on CPUs (PyTorch's dynamic quantization has no {device.type} "
                          "kernels); on a GPU decode in bf16, without --quantize")
    if compile:
        raise ConfigError(f"--quantize {kind} and --compile do not combine: the compiled step multiplies fp32 "
                          "weights; choose one")


def quantized(model: nn.Module, kind: str = "int8") -> nn.Module:
    """A copy of ``model`` (on the CPU, in eval mode) whose ``nn.Linear`` maps compute in int8.

    Tied weights (the output projection and the embedding) part: the projection's int8 copy is its
    own, the embedding stays fp32.
    """
    check_quantize(kind, model_device(model))
    spec = {nn.Linear: torch.ao.quantization.per_channel_dynamic_qconfig}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*(torch\.ao\.quantization|torch\.quantize_per).*deprecated")
        quantized = torch.ao.quantization.quantize_dynamic(copy.deepcopy(model).eval(), spec, dtype=torch.qint8)
    # A module swap, as LoRA's: the copy is decoding's own.
    return swap_modules(quantized, lambda m: Int8Linear(m) if Int8Linear.calls_the_kernel_of(m) else None)


class Int8Linear(nn.Module):
    """A quantized linear map (``quantized``, PyTorch's dynamic one) that calls the int8 kernel itself, its packed
    weight bound.

    The quantized module's own forward reads its packed weight's dtype and its version through two attribute
    lookups and converts the fp32 result to fp32 on every call, which a GPT step at batch 1 pays 25 times: the
    cost is measured in docs/BENCHMARKS.md ("int8 decoding"). The kernel and its arguments are the ones that
    forward passes for an int8 weight of a current module (version 4: ``reduce_range``). The copy is made for
    decoding and never loads other weights, so the bound weight cannot go stale.
    """

    def __init__(self, quantized: nn.Module) -> None:
        super().__init__()
        self.quantized = quantized  # kept for what it holds (its weight, scales, repr); never called
        self.in_features, self.out_features = quantized.in_features, quantized.out_features
        self.packed = quantized._packed_params._packed_params

    @staticmethod
    def calls_the_kernel_of(module: nn.Module) -> bool:
        """Whether ``module`` is a dynamic int8 linear map whose forward :class:`Int8Linear` can call directly."""
        return (isinstance(module, torch.ao.nn.quantized.dynamic.Linear) and module._packed_params.dtype == torch.qint8
                and module.version is not None and module.version >= 4)

    def forward(self, x: Tensor) -> Tensor:
        return torch.ops.quantized.linear_dynamic(x, self.packed, reduce_range=True)


__all__ = ["KINDS", "check_quantize", "quantized", "Int8Linear"]
