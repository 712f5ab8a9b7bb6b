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
runs matmuls through oneDNN, and two caches keep state for every distinct shape, up to 1,024 shapes
each: oneDNN's primitive cache (a primitive with its own JIT-compiled code) and ideep's cache of
matmul setups in front of it. A run's shapes keep changing (every prefill and micro-batch has its
own rows x tokens), so a bfloat16 run's memory in use grew step after step until both were full.
``benchmarks/kernel_cache.py`` measures it: on a 2-core AMD EPYC, a bfloat16 ``Linear(576, 1536)``
fed 600 random row counts kept 0.37 GB more in use with both caches at their default, 0.04 GB with
both at 64 and none at 8, at the same speed; float32 keeps nothing (no per-shape state on that path).
A cache smaller than the shapes one layer uses would rebuild kernels in every layer; 64 leaves
room. On the SmolLM2 demo, per step, the memory in use between steps grew by ~0.08 GB by default and by
~0.035 GB with both caches at 64 (docs/models.md). oneDNN reads its capacity
(``ONEDNN_PRIMITIVE_CACHE_CAPACITY``) once, when torch loads; ideep reads its own
(``LRU_CACHE_CAPACITY``) at the first bfloat16 matmul. So the ``lightning-rl`` command bounds both
before any command imports torch, the trainer bounds ideep's when ``fit`` starts (in time unless a
bfloat16 matmul already ran), and a script can set the variables itself.

:func:`drop_idle_gpu_libraries` takes out of the resident set what a CPU machine maps and never runs:
PyPI's torch for Linux is the CUDA build, and importing it with transformers leaves ~0.27 GB of
cuBLAS, NVRTC, nvJitLink and triton pages resident. The torch backend drops them once its model is
loaded, and every ``release_free_memory`` looks for libraries loaded since.

:func:`memory_breakdown` says what the resident memory between steps is made of, so that a floor
that rises step after step can be pinned on a kind of memory before anyone guesses at its cause:
blocks malloc has handed out and not had back (live tensors, oneDNN's primitives, anything that
calls ``malloc``), free blocks malloc still holds, and the anonymous memory malloc knows nothing of
(Python's own object arenas, and anything else that maps memory itself). The trainer logs it after each
step's trim (``mem/step_end/*_gb``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import re
import sys
from functools import cache
from typing import Any

__all__ = [
    "release_free_memory",
    "drop_idle_gpu_libraries",
    "map_large_blocks",
    "bound_kernel_cache",
    "memory_breakdown",
    "PeakMemory",
    "KERNEL_CACHE_PRIMITIVES",
    "KERNEL_CACHE_VARIABLES",
]


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
    if getattr(libc, "mallinfo2", None) is not None:  # glibc 2.33+
        libc.mallinfo2.restype = _MallInfo2
    return libc


def _trim() -> Any:
    libc = _glibc()
    return libc.malloc_trim if libc is not None else None


def release_free_memory() -> bool:
    """Return the pages glibc's allocator holds free to the system; True when any was returned.

    Safe to call from any thread at any time (``malloc_trim`` locks each arena in turn); False and a
    no-op where the C library has no ``malloc_trim``. Also drops idle GPU libraries' pages
    (``drop_idle_gpu_libraries``: once per library, a ~2 ms check otherwise).
    """
    drop_idle_gpu_libraries()
    trim = _trim()
    return bool(trim(0)) if trim is not None else False


_GPU_LIBRARY = re.compile(r"/(?:nvidia|triton|cuda)/|/lib(?:torch_cuda|c10_cuda)[^/]*\.so")
"""Files of the GPU stack that a process gets from PyPI's torch (a CUDA build on Linux) and transformers (triton)."""
_MADV_DONTNEED = 4
_gpu_maps_seen: set[str] = set()


def drop_idle_gpu_libraries() -> float:
    """On a machine without a GPU, drop the resident pages of the GPU libraries this process mapped;
    the GB dropped (0.0 with a GPU, without torch, off Linux, or when nothing new was mapped).

    PyPI's torch for Linux is the CUDA build: importing it loads cuBLAS, NVRTC, nvJitLink and more,
    and transformers loads triton. Loading touched their pages, so on a CPU machine ~0.27 GB of them
    stay resident, and count in every peak, while none of their code runs again (a forward and
    backward pass after the drop maps back a few percent: ``tests/core/test_memory.py``). Only
    read-only mappings that hold no private page (none copied on write, such as a library's
    relocated tables, none swapped) are dropped, with ``MADV_DONTNEED``: what goes is the file's own
    content, which the kernel maps back from the page cache if the code ever runs. Each mapping is
    looked at once; one loaded later is found by a read of ``/proc/self/maps``.
    """
    libc, torch = _glibc(), sys.modules.get("torch")
    if libc is None or torch is None or torch.cuda.is_available():
        return 0.0
    try:
        with open("/proc/self/maps") as f:
            spans = (line.split(None, 1)[0] for line in f if _gpu_candidate(line))
            fresh = {span for span in spans if span not in _gpu_maps_seen}
        if not fresh:
            return 0.0
        with open("/proc/self/smaps") as f:
            mappings = _smaps(f.read(), fresh)
    except OSError:
        return 0.0
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    dropped = 0
    for span, fields in mappings.items():
        _gpu_maps_seen.add(span)
        if fields.get("Anonymous", 0) == 0 and fields.get("Swap", 0) == 0 and fields.get("Rss", 0) > 0:
            start, end = (int(x, 16) for x in span.split("-"))
            if libc.madvise(start, end - start, _MADV_DONTNEED) == 0:
                dropped += fields["Rss"]
    return dropped / 1e6  # kB -> GB


def _gpu_candidate(maps_line: str) -> bool:
    """A ``/proc/self/maps`` line of a read-only mapping of a GPU library's file."""
    parts = maps_line.split(None, 5)
    return len(parts) == 6 and "w" not in parts[1] and _GPU_LIBRARY.search(parts[5]) is not None


def _smaps(text: str, spans: set[str]) -> dict[str, dict[str, int]]:
    """The ``kB`` fields of the ``/proc/self/smaps`` entries of ``spans`` (``start-end``)."""
    out: dict[str, dict[str, int]] = {}
    fields: dict[str, int] | None = None
    for line in text.splitlines():
        head = line.split(None, 1)[0] if line else ""
        if "-" in head and not head.endswith(":"):
            fields = out.setdefault(head, {}) if head in spans else None
        elif fields is not None and line.endswith(" kB"):
            name, value = line.split(":", 1)
            fields[name] = int(value.split()[0])
    return out


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
"""Shapes each of torch's CPU kernel caches keeps (``bound_kernel_cache``); their default is 1,024.
A decode step's layer uses a few (one per distinct weight shape), an update's backward more."""

KERNEL_CACHE_VARIABLES = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")
"""oneDNN's primitive cache (read when torch loads) and ideep's matmul cache (read at first use)."""


def bound_kernel_cache(primitives: int = KERNEL_CACHE_PRIMITIVES) -> list[str]:
    """Cap torch's CPU kernel caches at ``primitives`` shapes each, leaving any variable the
    environment already sets; returns the variables this call set. oneDNN's is set only while
    torch is not imported yet (it reads the variable once, when torch loads); ideep's at any time
    (it reads it at the first bfloat16 matmul, and setting it later does nothing)."""
    chosen: list[str] = []
    for name in KERNEL_CACHE_VARIABLES:
        if name in os.environ or (name == "ONEDNN_PRIMITIVE_CACHE_CAPACITY" and "torch" in sys.modules):
            continue
        os.environ[name] = str(primitives)
        chosen.append(name)
    return chosen


class _MallInfo2(ctypes.Structure):
    """glibc's ``struct mallinfo2`` (2.33+): every field a ``size_t``, summed over all arenas."""

    _fields_ = [  # noqa: RUF012 - ctypes reads this class attribute
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


def memory_breakdown() -> dict[str, float]:
    """This process's memory in GB, by kind; an empty dict where Linux's ``/proc`` or glibc's
    ``mallinfo2`` is missing.

    - ``resident``: the resident set (``VmRSS``); ``resident_file``: the part that is mapped files
      (the shared libraries' code, mostly), which no allocation can grow.
    - ``malloc_in_use``: blocks malloc handed out and has not had back, arena and mapped ones.
    - ``malloc_free``: free blocks malloc holds (resident or not: a trim returns whole pages only).
    - ``other_anonymous``: anonymous resident memory minus ``malloc_in_use``, floored at zero:
      Python's object arenas, anything else that maps memory itself, and malloc's free blocks that
      are still resident (``mallinfo2`` cannot tell those from the ones already returned).
    """
    libc = _glibc()
    status = _proc_status_kb()
    if libc is None or getattr(libc, "mallinfo2", None) is None or not status:
        return {}
    info: _MallInfo2 = libc.mallinfo2()
    in_use = (int(info.uordblks) + int(info.hblkhd)) / 1e9
    anonymous = status.get("RssAnon", 0) / 1e6
    return {
        "resident": status.get("VmRSS", 0) / 1e6,
        "resident_file": status.get("RssFile", 0) / 1e6,
        "malloc_in_use": in_use,
        "malloc_free": int(info.fordblks) / 1e9,
        "other_anonymous": max(anonymous - in_use, 0.0),
    }


def _proc_status_kb() -> dict[str, int]:
    """The ``kB`` fields of ``/proc/self/status``; empty off Linux."""
    try:
        with open("/proc/self/status") as f:
            text = f.read()
    except OSError:
        return {}
    return {name: int(kb) for name, kb in re.findall(r"^(\w+):\s+(\d+) kB$", text, flags=re.MULTILINE)}


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
    peak = _proc_status_kb().get("VmHWM")
    return peak / 1e6 if peak is not None else None
