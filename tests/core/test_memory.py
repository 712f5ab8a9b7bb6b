"""``release_free_memory``: freed heap memory that glibc keeps goes back to the system."""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lightning_rl.memory import KERNEL_CACHE_VARIABLES, release_free_memory

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim is Linux-only")


def _rss_anon_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no RssAnon in /proc/self/status")


def _touch_fresh_pages(size: int) -> None:
    """Make ``size`` bytes resident, then unmap them. An anonymous map, not a ``bytearray``: in a long
    pytest process malloc can serve 300 MB from freed, still-resident heap chunks (CI once did), and
    the resident set, so the peak, would not move at all."""
    import mmap

    block = mmap.mmap(-1, size)
    try:
        for i in range(0, size, mmap.PAGESIZE):
            block[i] = 1
    finally:
        block.close()


def test_freed_chunks_in_the_middle_of_the_heap_are_returned() -> None:
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    if not hasattr(libc, "malloc_trim"):
        pytest.skip("not glibc")
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
    size, count = 64 * 1024, 4000  # below the mmap threshold: served from the heap, 250 MB in all
    chunks = [libc.malloc(size) for _ in range(count)]
    for c in chunks:
        libc.memset(c, 1, size)  # touched: resident
    kept = chunks[::50]  # every 50th stays allocated, so the free space is in the middle, not at the top
    for i, c in enumerate(chunks):
        if i % 50:
            libc.free(c)
    before = _rss_anon_mb()
    try:
        assert release_free_memory() is True
        after = _rss_anon_mb()
        # glibc kept the ~245 MB freed above resident until the trim
        assert before - after > 150, (before, after)
    finally:
        for c in kept:
            libc.free(c)


def test_it_is_safe_to_call_repeatedly() -> None:
    for _ in range(3):
        release_free_memory()


def test_peak_memory_attributes_a_peak_to_the_phase_it_happened_in() -> None:
    import sys

    from lightning_rl.memory import PeakMemory

    memory = PeakMemory()
    memory.phase("quiet")
    _touch_fresh_pages(300_000_000)
    memory.phase("busy")
    if not sys.platform.startswith("linux"):
        assert memory.metrics() == {}
        return
    peaks = memory.metrics()
    assert peaks["mem/busy_peak_gb"] >= peaks["mem/quiet_peak_gb"] + 0.25


def test_peak_memory_keeps_the_peak_before_its_first_window_as_other() -> None:
    """Resetting the high-water mark unread would lose the peak of what ran before (a warm start),
    from the metrics and from the process's own exit rusage alike."""
    import sys

    from lightning_rl.memory import PeakMemory

    if not sys.platform.startswith("linux"):
        return
    PeakMemory()  # start a fresh window
    _touch_fresh_pages(300_000_000)  # resident, then unmapped before the next window
    memory = PeakMemory()
    memory.phase("quiet")
    peaks = memory.metrics()
    assert peaks["mem/other_peak_gb"] >= peaks["mem/quiet_peak_gb"] + 0.25


def test_large_blocks_are_mapped_so_that_freeing_one_returns_it_at_once() -> None:
    """Without the fixed threshold glibc serves a 24 MB block from an arena once one was freed (its
    threshold rises to it), and the arena keeps the pages after the free until a trim."""
    script = (
        "import sys; from lightning_rl.memory import map_large_blocks\n"
        "import torch\n"
        "def rss():\n"
        "    return next(int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmRSS')) / 1e3\n"
        "if sys.argv[1] == 'mapped': assert map_large_blocks()\n"
        "for _ in range(3):\n"
        "    before = rss(); t = torch.ones(6 * 1024 * 1024); del t\n"  # 24 MB, touched, freed
        "print(round(rss() - before))\n"
    )
    kept = {
        mode: int(
            subprocess.run([sys.executable, "-c", script, mode], capture_output=True, text=True, check=True).stdout
        )
        for mode in ("default", "mapped")
    }
    assert kept["mapped"] < 4, kept  # MB still resident after the last free


def _child_env(**set_: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in KERNEL_CACHE_VARIABLES}
    return {**env, **set_}


def _run(script: str, env: dict[str, str]) -> str:
    return subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True).stdout


def test_the_kernel_caches_are_bounded_in_time_and_never_over_the_users_setting() -> None:
    show = "import os; print(','.join(r) or '-', *(os.environ.get(v) for v in KERNEL_CACHE_VARIABLES))"
    call = "from lightning_rl.memory import KERNEL_CACHE_VARIABLES, bound_kernel_cache; r = bound_kernel_cache(); "
    both = "ONEDNN_PRIMITIVE_CACHE_CAPACITY,LRU_CACHE_CAPACITY"
    assert _run(call + show, _child_env()).split() == [both, "64", "64"]
    assert _run(call + show, _child_env(ONEDNN_PRIMITIVE_CACHE_CAPACITY="8")).split() == [
        "LRU_CACHE_CAPACITY",
        "8",
        "64",
    ]
    assert _run(call + show, _child_env(LRU_CACHE_CAPACITY="8")).split() == [
        "ONEDNN_PRIMITIVE_CACHE_CAPACITY",
        "64",
        "8",
    ]
    # after torch loaded, oneDNN has read its variable already; ideep reads its own at first use
    assert _run("import torch; " + call + show, _child_env()).split() == ["LRU_CACHE_CAPACITY", "None", "64"]


def test_the_lightning_rl_command_bounds_the_kernel_cache_before_its_commands_import_torch() -> None:
    script = (
        "import os, sys\n"
        "from lightning_rl.cli import main\n"
        "from lightning_rl.memory import KERNEL_CACHE_VARIABLES\n"
        "try:\n"
        "    main(['--version'])\n"
        "except SystemExit:\n"
        "    pass\n"
        "print('torch' in sys.modules, *(os.environ.get(v) for v in KERNEL_CACHE_VARIABLES))\n"
    )
    assert _run(script, _child_env()).splitlines()[-1].split() == ["False", "64", "64"]  # after --version's line


_BREAKDOWN_PROBE = """
import ctypes, ctypes.util, json, mmap
from lightning_rl.memory import memory_breakdown

libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
size = 200_000_000  # above any mmap threshold: one mapped block that malloc counts as in use
before = memory_breakdown()
block = libc.malloc(size)
libc.memset(block, 1, size)  # touched: resident
held = memory_breakdown()
libc.free(block)
# private anonymous memory malloc knows nothing of (a plain mmap(-1, n) is shared: RssShmem)
direct = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
for i in range(0, size, mmap.PAGESIZE):
    direct[i] = 1
mapped = memory_breakdown()
direct.close()
print(json.dumps({"before": before, "held": held, "mapped": mapped}))
"""


def test_memory_breakdown_puts_a_malloc_block_and_a_direct_map_in_different_kinds() -> None:
    """In a fresh interpreter, where nothing else allocates or frees between the readings. In the long
    pytest process CI once saw ``other_anonymous`` grow 0.39 GB for the 0.2 GB map: heap memory freed
    meanwhile stays resident, and ``mallinfo2`` cannot say which free blocks are, so it counts there."""
    import json

    readings = json.loads(_run(_BREAKDOWN_PROBE, _child_env()).splitlines()[-1])
    before, held, mapped = readings["before"], readings["held"], readings["mapped"]
    if not before:
        pytest.skip("no mallinfo2 (glibc < 2.33) or no /proc")
    assert set(before) == {"resident", "resident_file", "malloc_in_use", "malloc_free", "other_anonymous"}
    assert before["resident_file"] < before["resident"]
    assert held["malloc_in_use"] - before["malloc_in_use"] == pytest.approx(0.2, abs=0.02)
    assert held["resident"] - before["resident"] == pytest.approx(0.2, abs=0.02)
    assert held["other_anonymous"] == pytest.approx(before["other_anonymous"], abs=0.02)
    assert mapped["other_anonymous"] - before["other_anonymous"] == pytest.approx(0.2, abs=0.02)
    assert mapped["malloc_in_use"] == pytest.approx(before["malloc_in_use"], abs=0.02)


_GPU_PROBE = """
import json, re
import torch
from transformers import AutoModelForCausalLM, LlamaConfig
from lightning_rl.memory import _GPU_LIBRARY, drop_idle_gpu_libraries

def gpu_rss_gb():
    total, gpu = 0, False
    for line in open("/proc/self/smaps"):
        if re.match(r"^[0-9a-f]+-[0-9a-f]+ ", line):
            gpu = _GPU_LIBRARY.search(line) is not None
        elif gpu and line.startswith("Rss:"):
            total += int(line.split()[1])
    return total / 1e6

model = AutoModelForCausalLM.from_config(LlamaConfig(
    hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    vocab_size=1000))
before = gpu_rss_gb()
dropped = drop_idle_gpu_libraries()
after = gpu_rss_gb()
loss = model(torch.randint(0, 1000, (2, 16))).logits.float().pow(2).mean()
loss.backward()
print(json.dumps({"cuda": torch.cuda.is_available(), "before": before, "dropped": dropped, "after": after,
                  "after_work": gpu_rss_gb(), "again": drop_idle_gpu_libraries(), "loss": float(loss)}))
"""


def test_idle_gpu_libraries_are_dropped_and_cpu_training_still_runs() -> None:
    pytest.importorskip("transformers")
    r = json.loads(_run(_GPU_PROBE, _child_env()).splitlines()[-1])
    if r["cuda"] or r["before"] < 0.01:
        pytest.skip(f"nothing to drop: a GPU is present ({r['cuda']}) or torch maps no GPU library ({r['before']} GB)")
    assert r["dropped"] == pytest.approx(r["before"] - r["after"], abs=0.02)
    assert r["after"] < 0.1 * r["before"]
    # a forward and backward pass on the CPU runs after the drop, and maps back little of it (0.02 of 0.28 GB here)
    assert r["loss"] > 0 and r["after_work"] < 0.25 * r["before"]
    assert r["again"] == 0.0  # each mapping is dropped once


_PRIVATE_PAGES_PROBE = """
import ctypes, json, mmap, os, sys
import torch  # the drop runs only where torch is loaded
from lightning_rl.memory import drop_idle_gpu_libraries

folder = os.path.join(sys.argv[1], "nvidia")  # a path the drop takes for a GPU library's
os.makedirs(folder)
size = 16 * mmap.PAGESIZE
maps = {}
for name in ("clean", "copied"):
    path = os.path.join(folder, f"lib{name}.so")
    with open(path, "wb") as f:
        f.write(bytes(range(256)) * (size // 256))
    with open(path, "rb" if name == "clean" else "r+b") as f:
        prot = mmap.PROT_READ if name == "clean" else mmap.PROT_READ | mmap.PROT_WRITE
        maps[name] = mmap.mmap(f.fileno(), size, flags=mmap.MAP_PRIVATE, prot=prot)
sum(maps["clean"][i] for i in range(0, size, mmap.PAGESIZE))  # resident, clean
copied = maps["copied"]
copied[0] = 255  # a private copy of the first page (copy on write), then read-only as a library's relocations
address = ctypes.addressof(ctypes.c_char.from_buffer(copied))
libc = ctypes.CDLL(None)
libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
assert libc.mprotect(address, size, mmap.PROT_READ) == 0

def rss_kb(name):
    found, kb = False, 0
    for line in open("/proc/self/smaps"):
        if " " in line and line.split()[0].count("-") == 1 and not line.split()[0].endswith(":"):
            found = line.rstrip().endswith(f"lib{name}.so")
        elif found and line.startswith("Rss:"):
            kb += int(line.split()[1])
    return kb

before = {n: rss_kb(n) for n in maps}
dropped = drop_idle_gpu_libraries()
print(json.dumps({"cuda": torch.cuda.is_available(), "before": before, "after": {n: rss_kb(n) for n in maps},
                  "dropped_gb": dropped, "clean_reads": maps["clean"][1], "copied_reads": copied[0]}))
"""


def test_a_mapping_with_private_pages_is_never_dropped(tmp_path: Path) -> None:
    script = [sys.executable, "-c", _PRIVATE_PAGES_PROBE, str(tmp_path)]
    r = json.loads(subprocess.run(script, env=_child_env(), capture_output=True, text=True, check=True).stdout)
    if r["cuda"]:
        pytest.skip("a GPU is present: the drop does nothing there")
    assert r["before"]["clean"] > 0 and r["before"]["copied"] > 0
    assert r["after"]["clean"] == 0  # the file's own pages went ...
    assert r["clean_reads"] == 1  # ... and read back as the file's content
    assert r["after"]["copied"] == r["before"]["copied"]  # the mapping holding a private copy was left alone
    assert r["copied_reads"] == 255  # and the copy is still what the process wrote
