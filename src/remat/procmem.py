"""The process's own memory counters (Linux): resident set, its high-water mark, and a forked copy of the
process to measure in.  See NOTE [Measuring a step by the process] in `remat.verifier.process`."""

from __future__ import annotations

import ctypes
import json
import os
from collections.abc import Callable
from typing import Any

import torch

from remat._torch_compat import compile_on_this_thread
from remat._torch_compat.compiler import compiled_as_compiled

MMAP_THRESHOLD_BYTES = 65536
PROCESS_ENV = {"MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD_BYTES), "MKL_DISABLE_FAST_MM": "1"}
"""Rule 1: the environment in which resident memory follows the live tensors."""
M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter number (malloc.h)
IS_MMAPPED = 0x2  # glibc's bit in a chunk's size field: the chunk is a mapping of its own (malloc.c)
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")


def available() -> bool:
    """The counters can be read and reset here (Linux >= 4.0 with fork)."""
    return os.path.exists("/proc/self/clear_refs") and hasattr(os, "fork")


def resident_bytes() -> int:
    """The process's resident set now (Rule 2)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE_BYTES


def high_water_mark_bytes() -> int:
    """The process's peak resident set since it started or since `reset_high_water_mark` (Rule 2)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024  # kB
    raise OSError("no VmHWM line in /proc/self/status: the process's peak is read on Linux only")


def reset_high_water_mark() -> None:
    """Make the peak resident set equal to the current one (Rule 2)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def map_large_allocations() -> list[int]:
    """Rule 1 in a process that started without it, or again before a step: large allocations get mappings of their
    own from now on, and the heap's free memory, resident or not, is taken out of use by holding it (else a step
    reuses it unseen).  Blocks from MMAP_THRESHOLD_BYTES up are held: at that size malloc maps memory of its own
    unless free heap memory serves it, which the chunk's header says (glibc's IS_MMAPPED bit); never more than
    was free.  Returns the held blocks, never freed: call this only in a throw-away process."""
    libc = ctypes.CDLL(None)
    libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)
    libc.malloc.restype = ctypes.c_void_p
    libc.mallinfo2.restype = _MallInfo2
    free = libc.mallinfo2().fordblks
    held, size = [], 1 << 30
    while size >= MMAP_THRESHOLD_BYTES:
        block = libc.malloc(ctypes.c_size_t(size)) if size <= free else None
        if block and not ctypes.c_size_t.from_address(block - ctypes.sizeof(ctypes.c_size_t)).value & IS_MMAPPED:
            held.append(block)  # it came from the heap's free memory: keep it out of the step's way
            free -= size
        else:
            if block:
                libc.free(ctypes.c_void_p(block))
            size //= 2
    return held


def release_free_heap() -> None:
    """Give the heap's free pages back to the system (glibc's `malloc_trim(0)`), so that a step served from memory an
    earlier step freed on the heap raises the resident set as a fresh process would.  Small tensors (under
    MMAP_THRESHOLD_BYTES) live on the heap: without this a step reused resident free pages unseen, and the same
    compiled step measured 20.8 to 26.4 MiB over six fresh processes (the peers' Llama, 2026-12-05), 28.5 to 28.7
    over three with it.  Does nothing where the C library has no `malloc_trim`."""
    trim = getattr(ctypes.CDLL(None), "malloc_trim", None)
    if trim is not None:
        trim(ctypes.c_size_t(0))


class CopyFailed(RuntimeError):
    """What the forked copy raised, as text."""


def in_forked_copy(fn: Callable[[], dict]) -> dict:
    """`fn()` in a forked copy of this process (Rule 5): one thread (a forked process cannot use its
    parent's OpenMP threads), large allocations mapped (Rule 1).  Its result must be JSON; nothing here
    changes.  Known limitations: Linux with glibc."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the copy: run, report through the pipe, and leave without running any cleanup
        try:
            os.close(read_end)
            torch.set_num_threads(1)
            compile_on_this_thread()  # a compiled step compiles again here, with no thread pool of the parent's
            map_large_allocations()
            with compiled_as_compiled():  # the copy compiles the step again, whatever this process compiled before
                text = json.dumps({"result": fn()})
        except BaseException as e:  # noqa: BLE001 - everything goes back to the parent as text
            text = json.dumps({"error": f"{type(e).__name__}: {e}"})
        try:  # never past here: a copy whose parent is gone (killed) must not go on as the parent
            with os.fdopen(write_end, "w") as f:
                f.write(text)
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as f:
        text = f.read()
    os.waitpid(pid, 0)
    message: dict[str, Any] = json.loads(text) if text else {"error": "the copy of this process died without a word"}
    if "error" in message:
        raise CopyFailed(message["error"])
    return message["result"]
