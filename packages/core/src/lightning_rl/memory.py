"""Give memory that was freed back to the operating system (glibc's ``malloc_trim``).

A training step allocates and frees gigabytes of short-lived tensors (activations, logits, the
engine's KV cache) from several threads: the event loop, the engine's decode thread and the update
worker. glibc serves each thread from its own arena and returns freed memory to the system only from
the top of an arena, so after a few steps most of a process's resident memory can be free memory the
allocator keeps. Measured on the SmolLM2 demo (``malloc_stats`` of the running process at step 2 of
10): glibc held 7.7 GB, of which 1.5 GB was in use, and the process's RSS kept growing step after
step (18-22 GB at the end of a run) while what it used did not.

``malloc_trim(0)`` walks every arena and returns the free pages (``MADV_DONTNEED``), wherever they
lie. It takes milliseconds, so the trainer calls :func:`release_free_memory` once per step and the
warm start once per phase. On other C libraries (musl, macOS, Windows) it does nothing.

Between trims, :func:`map_large_blocks` keeps the largest blocks out of the arenas altogether. glibc
serves a block from ``mmap`` (returned to the system the moment it is freed) only above a threshold
that it raises, by default, to the size of every mapped block freed, up to 32 MB: after the first
KV-cache buffer (~20 MB per layer in the SmolLM2 demo) is freed, every later one comes from an arena,
where it fragments. The trainer fixes the threshold at 16 MB, which turns the raising off.
Measured on the SmolLM2 RL phase (``benchmarks/memory_floor.py``, 4 steps, float32, one run each on
one warm start): the floor between steps went from 1.67-1.81 GB to 1.62-1.65 GB and steps 2-4's
rollout peaks from 2.81-3.12 to 2.76-2.90 GB, at the same step times (285 s against 287 s in all).

:class:`PeakMemory` says which phase of a step the process's peak belongs to: Linux keeps the peak
resident size (``VmHWM``) and lets a process reset it (``/proc/self/clear_refs``), so the trainer
resets it at the start of each phase and reads it at the end (``mem/<phase>_peak_gb`` in
metrics.jsonl). Elsewhere it reports nothing. The resets also lower what ``getrusage``/``wait4``
later report as the process's max RSS, so the process's peak is the largest ``mem/*_peak_gb``
(``other`` holds what ran outside the phases: for the first, everything before the trainer), not its exit rusage.

:func:`bound_kernel_cache` bounds the memory of torch's CPU kernels themselves. In bfloat16 torch
runs matmuls through oneDNN, which builds a primitive, with its own JIT-compiled
code, for every distinct shape, and keeps up to 1,024 of them. A run's shapes keep changing (every
prefill and micro-batch has its own rows x tokens). ``benchmarks/kernel_cache.py`` measures it: on
a 2-core AMD EPYC, a bfloat16 ``Linear(576, 1536)`` fed 600 inputs of random row counts kept 0.37 GB
more memory in use by default and 0.19 GB with the cache at 64 primitives, at the same speed, and
nothing in float32 (no per-shape state on that path). On the SmolLM2 demo the cap lowered the floor
between steps by about 0.25 GB at first, less later (docs/models.md). The capacity is read once, when torch loads
(``ONEDNN_PRIMITIVE_CACHE_CAPACITY``), so only a process that has not imported torch yet can set
it: the ``lightning-rl`` command does, and a script can set the variable itself.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import re
import sys
from functools import cache
from typing import Any

__all__ = ["release_free_memory", "map_large_blocks", "bound_kernel_cache", "PeakMemory", "KERNEL_CACHE_PRIMITIVES"]


@cache
def _glibc() -> Any:
    """glibc, loaded once; None on other C libraries (no ``malloc_trim``) and off Linux."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None
    if getattr(libc, "malloc_trim", None) is None:  # glibc only
        return None
    libc.malloc_trim.argtypes = [ctypes.c_size_t]
    libc.malloc_trim.restype = ctypes.c_int
    return libc


def _trim() -> Any:
    libc = _glibc()
    return libc.malloc_trim if libc is not None else None


def release_free_memory() -> bool:
    """Return the pages glibc's allocator holds free to the system; True when any was returned.

    Safe to call from any thread at any time (``malloc_trim`` locks each arena in turn); False and a
    no-op where the C library has no ``malloc_trim``.
    """
    trim = _trim()
    return bool(trim(0)) if trim is not None else False


_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter number (malloc.h)
LARGE_BLOCK_BYTES = 16 * 1024 * 1024
"""Blocks this large or larger are mapped (``mmap``), and unmapped when freed (see the module docstring)."""


def map_large_blocks(threshold: int = LARGE_BLOCK_BYTES) -> bool:
    """Serve blocks of ``threshold`` bytes or more from ``mmap`` for the rest of the process (glibc's
    ``mallopt(M_MMAP_THRESHOLD)``, which also stops glibc raising that threshold by itself); True when
    set. A no-op, False, off glibc. Setting it again only moves the threshold."""
    libc = _glibc()
    if libc is None:
        return False
    return bool(libc.mallopt(ctypes.c_int(_M_MMAP_THRESHOLD), ctypes.c_int(threshold)))


KERNEL_CACHE_PRIMITIVES = 64
"""oneDNN primitives kept per process (``bound_kernel_cache``); its default is 1,024."""


def bound_kernel_cache(primitives: int = KERNEL_CACHE_PRIMITIVES) -> bool:
    """Cap oneDNN's primitive cache at ``primitives`` (``ONEDNN_PRIMITIVE_CACHE_CAPACITY``) unless the
    environment already sets it; True when this call set it. It must run before ``import torch``
    (oneDNN reads the variable once, when torch loads), so it does nothing once torch is imported."""
    if "torch" in sys.modules or "ONEDNN_PRIMITIVE_CACHE_CAPACITY" in os.environ:
        return False
    os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] = str(primitives)
    return True


class PeakMemory:
    """Peak resident memory per phase (see the module docstring); ``peaks`` maps phase -> GB."""

    def __init__(self) -> None:
        # the peak since the last window closed is kept as ``other`` (for the first window: model
        # loading and a warm start in the same process): resetting it unread would erase it from the
        # process's own max RSS too (``getrusage``/``wait4`` read the high-water mark the resets lower)
        before = _read_peak_gb()
        self.peaks: dict[str, float] = {"other": before} if before is not None else {}
        self._works = _reset_peak()

    def phase(self, name: str) -> None:
        """Record the peak since the last call (or construction) as ``name``'s, then start a new window."""
        if not self._works:
            return
        peak = _read_peak_gb()
        if peak is not None:
            self.peaks[name] = max(self.peaks.get(name, 0.0), peak)
        _reset_peak()

    def metrics(self, prefix: str = "mem") -> dict[str, float]:
        return {f"{prefix}/{name}_peak_gb": gb for name, gb in self.peaks.items()}


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return True


def _read_peak_gb() -> float | None:
    try:
        with open("/proc/self/status") as f:
            found = re.search(r"VmHWM:\s+(\d+) kB", f.read())
    except OSError:
        return None
    return int(found.group(1)) / 1e6 if found else None
