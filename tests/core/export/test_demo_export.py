"""The demo's own store, exported: it loads with ``datasets`` and trains one step of TRL's ``SFTTrainer``.

The demo runs for real (tiny model, gateway, runner, one RL step), so its store holds what a user's
run holds: the calculator agent's tool calls and reports, with the engine's exact token ids. Both
SFT shapes are trained on: the conversational prompt-completion parquet (TRL renders it with the
model's chat template) and the transitions parquet (already tokenized: the recorded ids as they are).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

pytest.importorskip("torch")
datasets = pytest.importorskip("datasets")

from lightning_rl.export import Selection, export_sft, export_transitions  # noqa: E402
from lightning_rl.store.base import LightningStore  # noqa: E402
from lightning_rl.store.sqlite import SQLiteStore  # noqa: E402

T = TypeVar("T")

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def demo_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from lightning_rl.demo.run import DemoConfig, run_demo

    run_dir = tmp_path_factory.mktemp("demo") / "demo"
    cfg = DemoConfig(
        run_dir=str(run_dir),
        steps=1,
        batch_size=2,
        group_size=2,
        n_train=12,
        n_val=4,
        expert_steps=4,
        polish_steps=2,
        habit_steps=2,
        sft_batch_size=4,
        val_every=0,
        progress=False,
    )
    run_demo(cfg)
    return run_dir / "store.sqlite"


def export(store_path: Path, work: Callable[[LightningStore], Awaitable[T]]) -> T:
    async def run() -> T:
        store = SQLiteStore(store_path)
        try:
            return await work(store)
        finally:
            await store.close()

    return asyncio.run(run())


def one_sft_step(dataset: Any, tmp_path: Path) -> float:
    trl = pytest.importorskip("trl")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lightning_rl.engine.tiny import default_tiny_model

    model_dir = str(default_tiny_model())  # the demo's vocabulary: its token ids are this tokenizer's
    config = trl.SFTConfig(
        output_dir=str(tmp_path / "trl"),
        max_steps=1,
        per_device_train_batch_size=2,
        learning_rate=1e-3,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        dataset_num_proc=None,
    )
    trainer = trl.SFTTrainer(
        model=AutoModelForCausalLM.from_pretrained(model_dir),
        args=config,
        train_dataset=dataset,
        processing_class=AutoTokenizer.from_pretrained(model_dir),
    )
    result = trainer.train()
    assert result.global_step == 1
    return float(result.training_loss)


def test_the_demo_store_exports_and_loads_with_datasets(demo_store: Path, tmp_path: Path) -> None:
    report = export(demo_store, lambda s: export_sft(s, tmp_path / "sft.parquet", fmt="trl"))
    data = datasets.load_dataset("parquet", data_files=str(tmp_path / "sft.parquet"), split="train")
    assert len(data) == report.records > 0
    assert data.column_names == ["prompt", "completion", "tools"]
    assert {m["role"] for row in data for m in row["prompt"]} >= {"user"}
    assert all(row["completion"][0]["role"] == "assistant" for row in data)
    # a tool call, where the barely warmed-up model made one, comes through in OpenAI shape
    calls = [c for row in data for c in (row["completion"][0]["tool_calls"] or [])]
    assert all(c["type"] == "function" and isinstance(json.loads(c["function"]["arguments"]), dict) for c in calls)

    report = export(demo_store, lambda s: export_sft(s, tmp_path / "sft.jsonl", selection=Selection(mode="train")))
    assert report.records > 0 and len((tmp_path / "sft.jsonl").read_text().splitlines()) == report.records


def test_the_sft_export_trains_one_step_of_trls_sft_trainer(demo_store: Path, tmp_path: Path) -> None:
    export(demo_store, lambda s: export_sft(s, tmp_path / "sft.parquet", fmt="trl"))
    data = datasets.load_dataset("parquet", data_files=str(tmp_path / "sft.parquet"), split="train")
    loss = one_sft_step(data, tmp_path)
    assert loss > 0 and loss == loss


def test_the_transitions_export_trains_trl_on_the_recorded_token_ids(demo_store: Path, tmp_path: Path) -> None:
    report = export(demo_store, lambda s: export_transitions(s, tmp_path / "t.parquet", fmt="parquet"))
    data = datasets.load_dataset("parquet", data_files=str(tmp_path / "t.parquet"), split="train")
    assert len(data) == report.records > 0 and all(row["exact_tokens"] for row in data)
    tokenized = data.select_columns(["input_ids", "completion_mask"])
    loss = one_sft_step(tokenized, tmp_path)
    assert loss > 0 and loss == loss
