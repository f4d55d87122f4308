"""aligner/malloc.py: with keep_freed_memory(), glibc serves a large tensor from its heap (and
reuses it) instead of fresh mmap()ed pages; ALIGNER_MALLOC=system leaves glibc as it is; the
`align` command applies it. Each case runs in a fresh interpreter, because the settings last
for the life of a process."""
from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
    reason="the settings are glibc's (elsewhere keep_freed_memory does nothing)")

# prints {"applied": ..., "mapped_while_alive": bytes in mmap()ed chunks while a 64 MiB tensor
# lives, "kept_after_free": how much larger the heap is once it is freed than before it}
PROBE = r"""
import ctypes, json, sys
import torch

class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
                 "uordblks", "fordblks", "keepcost")]

libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = MallInfo2
applied = None
if sys.argv[1] == "function":
    from aligner.malloc import keep_freed_memory
    applied = keep_freed_memory()
elif sys.argv[1] == "cli":
    from aligner.cli import main
    try:
        main(["score-aer", "-g", sys.argv[2], "-a", sys.argv[3]], standalone_mode=False)
    except SystemExit:
        pass
heap_before = libc.mallinfo2().arena
tensor = torch.ones(16 << 20)                      # 64 MiB, above any mmap threshold
mapped = libc.mallinfo2().hblkhd
del tensor
print(json.dumps({"applied": applied, "mapped_while_alive": mapped,
                  "kept_after_free": libc.mallinfo2().arena - heap_before}))
"""


def _probe(*args: str, env_extra=None) -> dict:
    env = dict(os.environ)
    env.pop("ALIGNER_MALLOC", None)
    env.update(env_extra or {})
    done = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True,
                          env=env, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_glibc_alone_maps_a_large_tensor_and_keep_freed_memory_puts_it_on_the_heap():
    plain = _probe("none")
    assert plain["mapped_while_alive"] >= 64 << 20           # glibc's default: its own mmap
    kept = _probe("function")
    assert kept["applied"] is True
    assert kept["mapped_while_alive"] < 64 << 20             # from the heap
    # and kept when freed (the heap grows by the tensor less what it already had free at its
    # top: a few KiB, depending on what the imports before it allocated)
    assert kept["kept_after_free"] >= 63 << 20


def test_aligner_malloc_system_leaves_the_allocator_as_it_is():
    probe = _probe("function", env_extra={"ALIGNER_MALLOC": "system"})
    assert probe["applied"] is False
    assert probe["mapped_while_alive"] >= 64 << 20
    assert probe["kept_after_free"] < 64 << 20


def test_the_align_command_applies_it(tmp_path):
    gold, links = tmp_path / "gold.talp", tmp_path / "links.align"
    gold.write_text("1 1 S\n")
    links.write_text("0-0\n")
    assert _probe("cli", str(gold), str(links))["mapped_while_alive"] < 64 << 20
    system = _probe("cli", str(gold), str(links), env_extra={"ALIGNER_MALLOC": "system"})
    assert system["mapped_while_alive"] >= 64 << 20


@pytest.mark.parametrize("value", ["bogus", "sytem"])
def test_an_unknown_aligner_malloc_value_is_one_line_listing_the_values(tmp_path, value):
    """A typo in ALIGNER_MALLOC is not silently the default: the `align` command stops with one
    line naming the variable and the values it takes, before any work."""
    gold, links = tmp_path / "gold.talp", tmp_path / "links.align"
    gold.write_text("1 1 S\n")
    links.write_text("0-0\n")
    out = tmp_path / "out.align"
    done = subprocess.run([sys.executable, "-m", "aligner", "symmetrize", "-f", str(links),
                           "-r", str(links), "-o", str(out)], capture_output=True, text=True,
                          env={**os.environ, "ALIGNER_MALLOC": value})
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"align: error: ALIGNER_MALLOC='{value}': unknown value")
    assert "system" in lines[0] and not out.exists()


def test_aligner_malloc_system_in_any_case_is_accepted():
    assert _probe("function", env_extra={"ALIGNER_MALLOC": " System "})["applied"] is False


def test_the_align_group_limits_the_kernel_caches_unless_the_user_set_them(monkeypatch):
    """oneDNN reads ONEDNN_PRIMITIVE_CACHE_CAPACITY, ideep LRU_CACHE_CAPACITY, when torch
    first uses them: the group sets the project's caps before any command imports torch (and
    its spawned workers inherit them); a value the user set is kept."""
    from aligner import malloc

    caps = {malloc.ONEDNN_CACHE: malloc.ONEDNN_CACHE_KERNELS,
            malloc.IDEEP_CACHE: malloc.IDEEP_CACHE_PRIMITIVES}
    for name in caps:
        monkeypatch.delenv(name, raising=False)
    malloc.limit_kernel_cache()
    assert {name: os.environ[name] for name in caps} == caps
    for name in caps:
        monkeypatch.setenv(name, "512")
    malloc.limit_kernel_cache()
    assert all(os.environ[name] == "512" for name in caps)
    code = ("import os, sys; from aligner.cli import main; "
            "sys.argv = ['align', 'score-aer', '--help']\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\n"
            "print(os.environ.get('ONEDNN_PRIMITIVE_CACHE_CAPACITY'), "
            "os.environ.get('LRU_CACHE_CAPACITY'), 'torch' in sys.modules)")
    env = {k: v for k, v in os.environ.items() if k not in caps}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, check=True).stdout.split()
    assert out[-3:] == [malloc.ONEDNN_CACHE_KERNELS, malloc.IDEEP_CACHE_PRIMITIVES,
                        "False"]   # set before torch loads


# prints {"applied": ..., "held": resident kB that a freed 64 MiB tensor below a live small
# array leaves, "released": how many of them release_free_memory() gives back}
RELEASE_PROBE = r"""
import json
import numpy as np
import torch
from aligner.malloc import keep_freed_memory, release_free_memory

def resident_kb():
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))

keep_freed_memory()
before = resident_kb()
tensor = torch.ones(16 << 20)               # 64 MiB on the heap, every page touched
small = np.ones(1000)                       # a live array, as a line's soft matrix
del tensor
held = resident_kb() - before
applied = release_free_memory()
print(json.dumps({"applied": applied, "held": held, "released": held + before - resident_kb()}))
"""


def test_release_free_memory_gives_back_a_freed_tensor_below_a_live_array():
    """What an extraction's block leaves: a large freed tensor beside a small live array stays
    resident with keep_freed_memory() (on the heap, under its 1 GiB trim threshold);
    release_free_memory() gives its pages back."""
    env = {k: v for k, v in os.environ.items() if k != "ALIGNER_MALLOC"}
    done = subprocess.run([sys.executable, "-c", RELEASE_PROBE], capture_output=True,
                          text=True, env=env, check=True)
    probe = json.loads(done.stdout.strip().splitlines()[-1])
    assert probe["applied"] is True
    assert probe["held"] >= 60 << 10                   # kB: the freed tensor still resident
    assert probe["released"] >= 60 << 10


def test_release_free_memory_does_nothing_without_keep_freed_memory():
    code = ("from aligner.malloc import release_free_memory; "
            "print(release_free_memory())")
    env = {**os.environ, "ALIGNER_MALLOC": "system"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, check=True).stdout.split()
    assert out[-1] == "False"
