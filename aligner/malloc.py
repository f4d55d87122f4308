"""The C library's allocator settings for large tensors: freed memory is kept and reused.

PyTorch allocates CPU tensors with ``malloc``. glibc serves every request above its mmap
threshold (at most 32 MiB, 128 KiB at first) with fresh pages from ``mmap`` and gives them back
with ``munmap`` when the tensor is freed, so every large tensor of a training step — the direct
HMM's (B, I, H, J, d/H) context features and (B, J+1, J, a) alignment features, 10–40 MiB each
on batches of 1,200 tokens — is new memory that the kernel faults in and zeroes page by page
on first touch. On the 2-core benchmark machine the recipe's 25k en-fr job spent about 270 s
in the kernel (18 s with this module) and 1,084 s in training (1,014 s with it;
eval/results/train_speed_cpu.md).

:func:`keep_freed_memory` sets ``M_MMAP_MAX = 0`` (every allocation comes from the heap) and
``M_TRIM_THRESHOLD`` to 1 GiB (free memory at the top of the heap is kept up to that), so the
next tensor of a size reuses the memory of the last one. The cost is memory: the process's
resident memory stays near its peak instead of shrinking between batches, and the peak grows by
what the heap cannot reuse (PyTorch asks for 64-byte aligned blocks, and a freed block without
room for the alignment waits for a neighbour to be freed too): about 160 MiB more per
training process over an epoch of the recipe, 290 MiB more at the 25k en-fr job's peak
(eval/results/train_speed_cpu.md). The commands call it once per process (the ``align``
group, each direction's training process, each extraction worker).

Only glibc is changed (``mallopt``); elsewhere, and with the environment variable
``ALIGNER_MALLOC=system``, nothing is done. Any other value of ``ALIGNER_MALLOC`` (a typo) is
one error line listing the values, not silently the default.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform

from aligner.utils import AlignerError

#: glibc's mallopt parameters (malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4

#: free memory kept at the top of the heap before it is given back
TRIM_THRESHOLD_BYTES = 1 << 30

#: environment variable: "system" leaves the C library's allocator as it is
ENVIRONMENT = "ALIGNER_MALLOC"
#: its values (case and surrounding blanks ignored): unset or empty, the default, keeps freed
#: memory; "system" leaves the allocator as it is
VALUES = ("system",)

_applied = False
#: the C library, once keep_freed_memory() has applied its settings (release_free_memory uses it)
_libc = None

#: batches of an extraction between two calls of :func:`release_free_memory`
#: (aligner/extract/inference.py)
RELEASE_BATCHES = 20


def keep_freed_memory() -> bool:
    """Make glibc reuse freed memory for large allocations (see the module docstring).

    Returns True when the settings are in effect in this process (also on a repeated call),
    False where they do not apply (not glibc, ``ALIGNER_MALLOC=system``, mallopt refused).
    An unknown ``ALIGNER_MALLOC`` value raises AlignerError (one line listing the values).
    """
    global _applied, _libc
    if _applied:
        return True
    value = os.environ.get(ENVIRONMENT, "").strip().lower()
    if value and value not in VALUES:
        raise AlignerError(f"{ENVIRONMENT}={os.environ[ENVIRONMENT]!r}: unknown value; expected "
                           f"{' or '.join(VALUES)} (leave the C library's allocator as it is), "
                           f"or unset it (keep freed memory for large tensors, the default)")
    if value == "system":
        return False
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    # mallopt returns 1 on success, 0 on error
    _applied = bool(mallopt(M_MMAP_MAX, 0)) and bool(mallopt(M_TRIM_THRESHOLD,
                                                               TRIM_THRESHOLD_BYTES))
    if _applied:
        _libc = libc
        libc.malloc_trim.argtypes, libc.malloc_trim.restype = [ctypes.c_size_t], ctypes.c_int
    return _applied


def release_free_memory() -> bool:
    """Give the free pages inside the heap back to the kernel (glibc's ``malloc_trim(0)``)
    where :func:`keep_freed_memory` is in effect; returns whether it ran.

    With every allocation on the heap, an extraction's small long-lived arrays (each line's
    soft matrix, kept until its block is written) land between the large freed tensors of its
    batches, so the heap cannot shrink from its top and grows with the block: a block process
    of the 407k en-fr recipe peaked 0.2 GB higher on 10,000 lines without this
    (eval/results/extract_memory.md). The extraction calls this every :data:`RELEASE_BATCHES`
    batches and before its block processes start; the freed tensors' memory is faulted in
    again at the next batch, a cost not measurable at that spacing."""
    if not _applied:
        return False
    _libc.malloc_trim(0)
    return True


#: oneDNN's cache of compiled matrix-product kernels, one per shape (torch's bfloat16 products
#: on the CPU run through oneDNN): 1,024 kernels by default, each with its own buffers, so an
#: extraction's varied batch shapes made it grow to 900 MiB on 2,000 Hansards lines (0.6 GiB
#: with at most 16 kernels, the same speed; eval/results/profile_extract.md)
ONEDNN_CACHE = "ONEDNN_PRIMITIVE_CACHE_CAPACITY"
ONEDNN_CACHE_KERNELS = "16"
#: ideep's cache (the oneDNN wrapper of torch's bfloat16 products on the CPU) of the
#: primitives it made, 1,024 by default, each holding its buffers: live memory that stayed
#: after an extraction in bfloat16 (0.27 GB after the calibration of `align run`, 0.3 GB per
#: block process; at most 16, the same speed and bytes: eval/results/extract_memory.md)
IDEEP_CACHE = "LRU_CACHE_CAPACITY"
IDEEP_CACHE_PRIMITIVES = "16"


def limit_kernel_cache() -> None:
    """Keep at most :data:`ONEDNN_CACHE_KERNELS` oneDNN kernels and
    :data:`IDEEP_CACHE_PRIMITIVES` ideep primitives (unless the user set
    ``ONEDNN_PRIMITIVE_CACHE_CAPACITY`` / ``LRU_CACHE_CAPACITY``). Read when torch first uses
    them: call this before its first bfloat16 product (the ``align`` group does; the
    processes it spawns inherit it)."""
    os.environ.setdefault(ONEDNN_CACHE, ONEDNN_CACHE_KERNELS)
    os.environ.setdefault(IDEEP_CACHE, IDEEP_CACHE_PRIMITIVES)
