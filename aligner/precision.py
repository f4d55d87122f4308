"""Precision: float32, or bfloat16 autocast (``--precision`` of ``align train``, ``align run``,
``align translate`` and ``align extract``, ``Aligner.load(..., precision=...)``).

``bf16`` runs the model's matrix products under :func:`torch.autocast` with dtype bfloat16:
parameters stay float32, linear layers and attention products return bfloat16 (about 3
significant digits). The numerically sensitive parts are computed in float32 by the models
themselves, which cast with ``.float()`` before them (or switch autocast off locally):

* every log_softmax / softmax that yields a probability the search or extraction reads
  (the transformer's output and attention weights, the direct HMM's lexicon and alignment
  α, the alignment layer's output and attention); the transformer's attention weights are
  then rounded to bfloat16 for their product with the values, and extraction reads them so
  (relative error <= 2^-9);
* the direct HMM's forward–backward, Viterbi and log-semiring products
  (aligner/models/hmm_algorithms.py works in its inputs' dtype, float32);
* the beam search's running scores and the finished hypotheses' log-probabilities.

In training the forward pass and the loss run under the context (parameters, gradients and
Adam's state stay float32). ``auto`` is bf16 on a CUDA device with native bfloat16 (compute
capability >= 8: A100, H100, RTX 30xx and later), float32 everywhere else (V100 and T4
emulate bfloat16, slowly); ``bf16`` is also accepted on older GPUs, which
emulate it. ``bf16`` on CPU uses CPU autocast: faster than float32 on CPUs with bfloat16
instructions (avx512_bf16, AMX; eval/results/precision_bf16.md, profile_extract.md), usually
slower on others; so ``auto`` inference (`align extract`, the final alignment of `align run`)
runs bf16 on a CPU with those instructions and float32 on others, while training on a CPU
(and so the self-training rounds' guides) stays float32 (bf16 training there is 1.3x faster
but cost en-fr dev AER and memory: eval/results/train_bf16_cpu.md). CPU autocast, unlike CUDA
autocast, does not promote softmax and layer norm to float32 by itself: the explicit
``.float()`` casts above are what keeps them exact.

Usage (the whole decoding or extraction call goes inside the context)::

    with autocast_context(resolve_precision("bf16", device), device):
        links = extract(loaded, bitext, method)
"""
from __future__ import annotations

import contextlib
from typing import ContextManager, Optional

import torch

from aligner import constants as C
from aligner.utils import check_condition

#: the choices of ``--precision`` (``auto`` resolves to one of the other two)
PRECISIONS = C.PRECISIONS


def resolve_precision(name: str, device: torch.device, inference: bool = False) -> str:
    """``fp32`` or ``bf16`` for the precision `name` on `device`.

    ``auto``: bf16 on CUDA with native bfloat16 and, for `inference` (the alignment of a
    bitext, `align extract`), on a CPU with bfloat16 instructions (:func:`cpu_native_bf16`),
    else fp32. ``bf16`` is accepted on CPU and on CUDA devices that support it; anything else
    is a one-line user error (:func:`choose_precision` with this machine's answers).
    """
    check_condition(name in PRECISIONS, f"--precision must be one of {', '.join(PRECISIONS)} "
                                        f"(got '{name}')")
    native = emulated = False
    if device.type == "cuda" and name != "fp32":
        native = cuda_supports_bf16(device, emulation=False)
        emulated = native or cuda_supports_bf16(device, emulation=True)
    elif device.type == "cpu" and name == "auto" and inference:
        native = cpu_native_bf16()
    return choose_precision(name, device, native, emulated)


#: /proc/cpuinfo flags of the x86 instructions that compute in bfloat16 (AVX-512 BF16 on
#: Zen 4 and Cooper Lake and later, AMX on Sapphire Rapids and later)
CPU_BF16_FLAGS = ("avx512_bf16", "amx_bf16")


def cpu_native_bf16(cpuinfo: str = "/proc/cpuinfo", capability: Optional[str] = None) -> bool:
    """Whether this CPU computes in bfloat16 natively: :data:`CPU_BF16_FLAGS` in the flags of
    `cpuinfo` (False where the file is absent, as on macOS and Windows) and torch running its
    AVX-512 kernels (`capability`, default ``torch.backends.cpu.get_cpu_capability()``; not
    under ``ATEN_CPU_CAPABILITY=default`` or ``avx2``, where torch emulates bfloat16)."""
    if capability is None:
        capability = torch.backends.cpu.get_cpu_capability()
    if not capability.upper().startswith("AVX512"):
        return False
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as handle:
            for line in handle:
                if line.startswith("flags"):
                    flags = set(line.partition(":")[2].split())
                    return any(flag in flags for flag in CPU_BF16_FLAGS)
    except OSError:
        pass
    return False


def choose_precision(name: str, device: torch.device, native_bf16: bool = False,
                     any_bf16: bool = False) -> str:
    """The pure rule of :func:`resolve_precision`: `native_bf16` / `any_bf16` say whether the
    device has bfloat16 units (a CPU: only where :func:`resolve_precision` asks, for
    inference) / runs bfloat16 at all (emulated counts); CPU autocast always runs it.
    ``auto`` -> ``bf16`` only where `native_bf16`."""
    check_condition(name in PRECISIONS, f"--precision must be one of {', '.join(PRECISIONS)} "
                                        f"(got '{name}')")
    if name == "auto":
        return "bf16" if device.type in ("cuda", "cpu") and native_bf16 else "fp32"
    if name == "bf16":
        check_condition(device.type == "cpu" or (device.type == "cuda" and any_bf16),
                        f"--precision bf16: not supported on device '{device}' "
                        f"(use --precision fp32)")
    return name


def cuda_supports_bf16(device: torch.device, emulation: bool) -> bool:
    """Whether CUDA device `device` runs bfloat16: natively (compute capability >= 8, e.g.
    A100/H100; ROCm devices count as native, as in torch) or, with `emulation`, at all (older
    GPUs emulate it, slowly). Written with calls of torch 2.4 and older
    (``is_bf16_supported(including_emulation=...)`` is newer than some torch we declare)."""
    if not emulation:
        return bool(torch.version.hip) or torch.cuda.get_device_capability(device) >= (8, 0)
    with torch.cuda.device(device):
        return torch.cuda.is_bf16_supported()


def active_autocast_dtype(device_type: str) -> Optional[torch.dtype]:
    """The dtype of the autocast this thread runs under on `device_type` ("cpu", "cuda"), or
    None outside one."""
    if not torch.is_autocast_enabled(device_type):
        return None
    return torch.get_autocast_dtype(device_type)


def autocast_context(precision: str, device: torch.device) -> ContextManager:
    """The context to run inference in: nothing for ``fp32``, bfloat16 autocast on `device`'s
    type for ``bf16`` (``auto`` is resolved first, see :func:`resolve_precision`)."""
    precision = resolve_precision(precision, device)
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
