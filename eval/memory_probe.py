"""The memory probe of eval/bench_hmm_memory.py and eval/bench_translate_memory.py: the extra
peak memory of one step, each measurement in a fresh process.

On CPU the extra peak is the growth of the process's peak resident set (resource.getrusage
ru_maxrss) over the step (tracemalloc does not see torch's allocations), with glibc's
MALLOC_MMAP_THRESHOLD_ fixed (:data:`FRESH_ENVIRONMENT`) so that every large tensor is its own
mapping, returned to the system when freed (otherwise glibc raises its threshold after large
frees and keeps freed blocks resident, and the peak would depend on allocation history); on
CUDA it is torch.cuda.max_memory_allocated over what was allocated before.
"""
from __future__ import annotations

import json
import os
import resource
import subprocess
import time
from typing import Any, Callable, Dict, Sequence

MiB = 1024 * 1024
#: the environment of every measuring process (see the module docstring)
FRESH_ENVIRONMENT = {"MALLOC_MMAP_THRESHOLD_": "131072"}


def peak_of(step: Callable[[], Any], device) -> Dict[str, Any]:
    """Run ``step()`` once on ``device`` (a torch.device); returns ``peak_mib`` (extra peak
    memory of the step), ``seconds`` and ``value`` (what the step returned)."""
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    else:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    start = time.perf_counter()
    value = step()
    if device.type == "cuda":
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - before
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
    return {"peak_mib": peak / MiB, "seconds": time.perf_counter() - start, "value": value}


def run_fresh(command: Sequence[str]) -> Dict[str, Any]:
    """Run ``command`` (a script measuring one cell) in a fresh process with
    :data:`FRESH_ENVIRONMENT`; its last line of standard output, read as JSON."""
    output = subprocess.run(list(command), check=True, capture_output=True, text=True,
                            env=dict(os.environ, **FRESH_ENVIRONMENT)).stdout
    return json.loads(output.strip().splitlines()[-1])
