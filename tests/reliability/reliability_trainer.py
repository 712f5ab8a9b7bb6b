"""A short real training run in its own process, so a test can kill it (and the gateway and engine it
hosts) with SIGKILL and start it again with ``resume``. Run as
``python reliability_trainer.py RUN_DIR MODEL fresh|resume STEPS``; prints the steps it trained as JSON."""

from __future__ import annotations

import json
import sys

from lightning_rl.backends.torch_backend import TorchBackendConfig
from lightning_rl.trainer import Trainer, TrainerConfig
from lightning_rl.types import Task


def main() -> None:
    run_dir, model, mode, steps = sys.argv[1:5]
    cfg = TrainerConfig(
        model=model,
        run_dir=run_dir,
        steps=int(steps),
        batch_size=3,
        group_size=2,
        max_tokens=8,
        val_every=0,
        concurrency=0,  # rollouts are run by a runner process, through a store server
        heartbeat_timeout_s=2.0,
        max_attempts=3,
        checkpoint_every=1,
        resume=mode == "resume",
        tensorboard=False,
        progress=False,
        backend=TorchBackendConfig(lr=1e-2, old_logprobs="sampled"),
    )
    result = Trainer(cfg).fit(None, [Task(input={"q": f"task {i}"}) for i in range(3)])
    print(json.dumps([int(r["step"]) for r in result.history if "train/reward_mean" in r]), flush=True)


if __name__ == "__main__":
    main()
