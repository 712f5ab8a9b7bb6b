"""Quickstart: train your own agent with LightningRL on the tiny local model, on CPU.

The agent is ordinary ``openai`` client code; the only Lightning-specific line is pointing the
client at ``llm.base_url`` (done by ``llm.async_openai_client()``). The reward here prefers short,
single-word answers, something a random tiny model can learn in a few steps.

    uv run python examples/quickstart.py --steps 10
"""

from __future__ import annotations

import argparse
from typing import Any

from lightning_rl import LLM, Task, Trainer, TrainerConfig
from lightning_rl.backends.torch_backend import TorchBackendConfig


async def agent(task: dict[str, Any], llm: LLM) -> float:
    client = llm.async_openai_client(max_retries=0)
    try:
        reply = await client.chat.completions.create(
            model=llm.model, messages=[{"role": "user", "content": task["question"]}], **dict(llm.sampling)
        )
    finally:
        await client.close()
    words = (reply.choices[0].message.content or "").split()
    return 1.0 if len(words) == 1 else 1.0 / (1 + len(words))


def main(argv: list[str] | None = None) -> float | None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--out", default="runs/quickstart")
    args = parser.parse_args(argv)
    topics = ["cats", "rain", "tea", "maps", "jazz", "snow", "bees", "moss"]
    tasks = [Task(input={"question": f"One word about {t}?"}) for t in topics]
    config = TrainerConfig(
        model="tiny",
        run_dir=args.out,
        steps=args.steps,
        batch_size=4,
        group_size=4,
        max_tokens=12,
        val_every=0,
        backend=TorchBackendConfig(lr=3e-3),
    )
    result = Trainer(config).fit(agent, tasks[:6], val_tasks=tasks[6:])
    print(f"held-out reward: {result.val_before:.3f} -> {result.val_after:.3f}")
    return result.val_after


if __name__ == "__main__":
    main()
