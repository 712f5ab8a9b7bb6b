"""Per-role LoRA adapters: each role's update moves its own adapter only, publishes only what changed,
and survives a checkpoint and a PEFT export. Real torch updates and a real engine serving the adapters."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM

from lightning_rl.backends.per_role import PerRoleAdaptersBackend, adapter_publisher, share_base_weights
from lightning_rl.backends.torch_backend import TorchBackendConfig
from lightning_rl.engine.base import GenerationOutput, SamplingParams
from lightning_rl.engine.hf import TransformersEngine
from lightning_rl.trainer.config import TrainerConfig
from lightning_rl.types import Transition

peft = pytest.importorskip("peft")

ROLES = ("writer", "rewriter")


def _config(**kwargs: Any) -> TorchBackendConfig:
    return TorchBackendConfig(old_logprobs="recompute", lr=5e-2, lora_rank=4, **kwargs)


@pytest.fixture
def served(tiny_model_path: Path) -> Iterator[tuple[TransformersEngine, PerRoleAdaptersBackend]]:
    """An engine serving per-role adapters and the backend training them, over one shared base."""
    with TransformersEngine.from_pretrained(tiny_model_path, max_batch_size=8) as engine:
        engine.enable_adapters(_config().lora_targets)
        backend = PerRoleAdaptersBackend(
            AutoModelForCausalLM.from_pretrained(tiny_model_path),
            _config(),
            publisher=adapter_publisher(engine),
            version=engine.version,
        )
        assert share_base_weights(backend.model, engine.model) > 0
        yield engine, backend


def _prompt(engine: TransformersEngine, role: str) -> list[int]:
    return engine.encode_chat(
        [{"role": "system", "content": f"you are the {role}"}, {"role": "user", "content": "hi"}], None
    )


def _batch(engine: TransformersEngine, role: str, n: int = 4) -> list[Transition]:
    prompt = _prompt(engine, role)
    return [
        Transition(
            prompt_ids=prompt,
            response_ids=[5 + i, 6, 7],
            role=role,
            rollout_id=f"{role}-{i}",
            attempt_id="a",
            advantage=1.0 if i % 2 == 0 else -1.0,
        )
        for i in range(n)
    ]


def _ask(engine: TransformersEngine, roles: dict[str, str | None]) -> dict[str, list[GenerationOutput]]:
    """Each role's greedy and seeded-sampled answers, all roles' rows decoded together."""

    async def run() -> list[GenerationOutput]:
        params = [
            SamplingParams(max_tokens=8, temperature=t, seed=s, adapter=adapter)
            for adapter in roles.values()
            for t, s in ((0.0, 0), (1.0, 1), (1.0, 2))
        ]
        names = list(roles)
        prompts = [_prompt(engine, names[i // 3]) for i in range(len(params))]
        return list(await asyncio.gather(*(engine.generate(p, s) for p, s in zip(prompts, params, strict=True))))

    outs = asyncio.run(run())
    return {role: outs[3 * i : 3 * i + 3] for i, role in enumerate(roles)}


def _same(a: list[GenerationOutput], b: list[GenerationOutput]) -> bool:
    return all(x.token_ids == y.token_ids and x.logprobs == y.logprobs for x, y in zip(a, b, strict=True))


def test_an_update_of_one_roles_adapter_leaves_the_other_roles_outputs_unchanged(
    served: tuple[TransformersEngine, PerRoleAdaptersBackend],
) -> None:
    engine, backend = served
    # both trainable roles get an adapter and one update; the checker has none (the base answers it)
    backend.update(_batch(engine, "writer") + _batch(engine, "rewriter"))
    assert asyncio.run(backend.publish()) == 1
    assert engine.adapter_names == ["rewriter", "writer"] and backend.adapter_versions == {"writer": 1, "rewriter": 1}
    roles: dict[str, str | None] = {"writer": "writer", "rewriter": "rewriter", "checker": None}
    before = _ask(engine, roles)
    rewriter_state = backend.adapter_state("rewriter")

    metrics = backend.update(_batch(engine, "writer"))  # the writer alone, twice: a visible change
    backend.update(_batch(engine, "writer"))
    assert "train/adapter/writer/loss" in metrics and "train/adapter/rewriter/loss" not in metrics
    sent: list[list[str]] = []

    async def spy(adapters: Any, version: int) -> None:
        sent.append(sorted(adapters))
        await engine.load_adapters(adapters, version)

    backend.adapter_publisher = spy
    asyncio.run(backend.publish())
    after = _ask(engine, roles)

    assert sent == [["writer"]]  # only the adapter that changed is published
    assert backend.adapter_versions == {"writer": 2, "rewriter": 1}
    assert all(o.adapter_version == 2 for o in after["writer"]) and all(
        o.adapter_version == 1 for o in after["rewriter"]
    )
    assert _same(before["rewriter"], after["rewriter"])  # exactly: tokens and logprobs
    assert _same(before["checker"], after["checker"])
    assert not _same(before["writer"], after["writer"])  # the writer did move
    state = backend.adapter_state("rewriter")
    assert all(torch.equal(state[k], rewriter_state[k]) for k in state)


def test_each_role_steps_its_own_optimiser_on_its_own_transitions(
    served: tuple[TransformersEngine, PerRoleAdaptersBackend],
) -> None:
    engine, backend = served
    # the same responses, rewarded for the writer and punished for the rewriter
    writer = [t.model_copy(update={"advantage": 1.0}) for t in _batch(engine, "writer")]
    rewriter = [t.model_copy(update={"advantage": -1.0}) for t in _batch(engine, "rewriter")]
    start = {role: backend.logprobs(b) for role, b in (("writer", writer), ("rewriter", rewriter))}
    metrics = backend.update(writer + rewriter)
    assert metrics["train/optimizer_steps"] == 2.0 and backend.step == 1
    for role, batch, sign in (("writer", writer, 1), ("rewriter", rewriter, -1)):
        assert metrics[f"train/adapter/{role}/optimizer_steps"] == 1.0
        now = backend.logprobs(batch)
        for a, b in zip(now, start[role], strict=True):
            assert sign * (sum(a) - sum(b)) > 0  # each adapter moved the way its own role's advantages say
    with pytest.raises(ValueError, match="no transition of a named role"):
        backend.update([t.model_copy(update={"role": None}) for t in writer])


def test_a_checkpoint_restores_every_adapter_and_the_engine_gets_them_back(
    served: tuple[TransformersEngine, PerRoleAdaptersBackend], tiny_model_path: Path, tmp_path: Path
) -> None:
    engine, backend = served
    backend.update(_batch(engine, "writer") + _batch(engine, "rewriter"))
    asyncio.run(backend.publish())
    backend.update(_batch(engine, "writer"))
    asyncio.run(backend.publish())
    roles: dict[str, str | None] = {"writer": "writer", "rewriter": "rewriter"}
    expected = _ask(engine, roles)
    backend.save_checkpoint(tmp_path / "ckpt")

    with TransformersEngine.from_pretrained(tiny_model_path, max_batch_size=8) as fresh:
        fresh.enable_adapters(_config().lora_targets)
        resumed = PerRoleAdaptersBackend(
            AutoModelForCausalLM.from_pretrained(tiny_model_path), _config(), publisher=adapter_publisher(fresh)
        )
        resumed.load_checkpoint(tmp_path / "ckpt")
        assert resumed.step == backend.step and resumed.adapter_versions == {"writer": 2, "rewriter": 1}
        assert asyncio.run(resumed.publish()) == backend.version + 1
        assert fresh.adapter_version("writer") == 2 and fresh.adapter_version("rewriter") == 1
        assert _same(expected["writer"], _ask(fresh, roles)["writer"])
        assert _same(expected["rewriter"], _ask(fresh, roles)["rewriter"])
        # the optimiser state came back too: the next update of both backends is the same
        batch = _batch(engine, "rewriter")
        backend.update(batch)
        resumed.update(batch)
        for a, b in zip(backend.logprobs(batch), resumed.logprobs(batch), strict=True):
            assert torch.allclose(torch.tensor(a), torch.tensor(b), atol=1e-6)


def test_the_exported_adapters_load_with_peft_and_give_the_trained_logprobs(
    served: tuple[TransformersEngine, PerRoleAdaptersBackend], tiny_model_path: Path, tmp_path: Path
) -> None:
    engine, backend = served
    writer, rewriter = _batch(engine, "writer"), _batch(engine, "rewriter")
    backend.update(writer + rewriter)
    folders = backend.export_adapters(tmp_path / "adapters")
    assert set(folders) == set(ROLES)
    for role, batch in (("writer", writer), ("rewriter", rewriter)):
        base = AutoModelForCausalLM.from_pretrained(tiny_model_path)
        loaded = peft.PeftModel.from_pretrained(base, str(folders[role]))
        ids = torch.tensor([batch[0].prompt_ids + batch[0].response_ids])
        with torch.no_grad():
            logits = loaded(input_ids=ids).logits[0, len(batch[0].prompt_ids) - 1 : -1]
        theirs = torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(batch[0].response_ids)[:, None])[:, 0]
        ours = torch.tensor(backend.logprobs(batch[:1])[0])
        assert torch.allclose(theirs, ours, atol=1e-4)


def test_per_role_adapters_need_a_lora_rank_and_policy_gradient() -> None:
    with pytest.raises(ValueError, match="lora_rank > 0"):
        TrainerConfig(adapters="per_role")
    with pytest.raises(ValueError, match="policy_gradient"):
        TrainerConfig(adapters="per_role", update_rule="sft", backend=_config())
    with pytest.raises(ValueError, match="'shared' or 'per_role'"):
        TrainerConfig(adapters="each")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="lora_rank > 0"):
        PerRoleAdaptersBackend(torch.nn.Linear(2, 2), TorchBackendConfig())


def test_adapter_names_are_folder_and_module_safe() -> None:
    from lightning_rl.roles import adapter_name

    assert adapter_name("writer") == "writer" and adapter_name("team/writer.v2") == "team_writer_v2"
    assert adapter_name("a") == "role_a"  # inside PEFT's "lora_" prefix, which PEFT would confuse with it
    with pytest.raises(ValueError, match="needs a role name"):
        adapter_name("")
