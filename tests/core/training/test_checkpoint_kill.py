"""A trainer killed while it saves a checkpoint must leave one it can resume from (issue 45).

Real processes: a child builds the tiny policy and saves checkpoints into one folder in a loop,
as the trainer does when it saves its last step a second time at the end of ``fit``; the test
kills it with SIGKILL mid-save and loads what is on disk. Before the save went through a renamed
temporary file, the kill left ``policy.pt`` truncated and ``load_checkpoint`` failed, so a run
killed during its final checkpoint could never resume (found by ``benchmarks/chaos.py``).
"""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lightning_rl.backends.torch_backend import TorchBackend, TorchBackendConfig

SAVER = """
import sys
from pathlib import Path
from lightning_rl.backends.torch_backend import TorchBackend, TorchBackendConfig

policy = TorchBackend.from_pretrained(sys.argv[1], TorchBackendConfig(lr=1e-3))
folder = Path(sys.argv[2])
n = 0
while True:
    policy.version = n
    policy.save_checkpoint(folder)
    n += 1
    if n == 1:
        print("saved", flush=True)
"""


@pytest.mark.slow
def test_a_kill_mid_save_leaves_a_checkpoint_that_loads(tiny_model_path: Path, tmp_path: Path) -> None:
    rng = random.Random(0)
    folder = tmp_path / "step_00006"
    for _ in range(2):
        child = subprocess.Popen(
            [sys.executable, "-c", SAVER, str(tiny_model_path), str(folder)], stdout=subprocess.PIPE, text=True
        )
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "saved"
        time.sleep(rng.uniform(0.0, 0.3))  # the loop is saving nearly all the time: this lands mid-save
        child.send_signal(signal.SIGKILL)
        child.wait(30)
        child.stdout.close()
        policy = TorchBackend.from_pretrained(tiny_model_path, TorchBackendConfig(lr=1e-3))
        policy.load_checkpoint(folder)  # raised on a truncated policy.pt before the fix
        assert policy.version >= 0
