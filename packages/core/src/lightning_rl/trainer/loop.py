"""The LightningRL loop, top to bottom.

``Trainer.fit(agent, train_tasks, val_tasks)`` starts the embedded services (a SQLite store in the
run folder, the inference engine behind the OpenAI-compatible gateway, an in-process runner) and
then, every step: publish resources -> enqueue the batch x group size -> wait -> adapt spans into
transitions -> update rule (credit assignment -> advantages -> policy update, for RL) -> publish the
new weights -> validate -> log -> checkpoint. The agent is the user's unchanged code; it only sees
``llm.base_url``.

What the update does with the scored rollouts is the one part that differs between the algorithms
that train weights; it lives behind ``UpdateRule`` (``lightning_rl.trainer.update_rules``), chosen
by ``TrainerConfig.update_rule``: policy gradient for GRPO/RLOO/PPO, rejection-sampled SFT, DPO.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import random
import statistics
import time
from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from lightning_rl.adapter import AIRPolicy, adapt_attempt, final_reward
from lightning_rl.agent import AgentFn
from lightning_rl.algorithms.base import TrainResult
from lightning_rl.capture import retokenize_samples
from lightning_rl.credit import RolloutSample
from lightning_rl.memory import PeakMemory, bound_kernel_cache, map_large_blocks, memory_breakdown, release_free_memory
from lightning_rl.plugins.base import declared_trainable
from lightning_rl.rewards import GroupJudge, judge_samples
from lightning_rl.roles import RoleSelector, RoleSpec
from lightning_rl.store.base import LightningStore
from lightning_rl.trainer.config import TrainerConfig
from lightning_rl.trainer.metrics import (
    MetricsLogger,
    has_tool_call,
    plot_reward_curve,
    tool_call_metrics,
)
from lightning_rl.trainer.progress import StepProgress
from lightning_rl.trainer.role_metrics import RoleCall, role_calls, role_metrics
from lightning_rl.trainer.services import Services, publish_resources, start_services
from lightning_rl.trainer.update_rules import UpdateRule, make_update_rule
from lightning_rl.types import (
    LLMResource,
    Resources,
    Rollout,
    RolloutConfig,
    RolloutRequest,
    RolloutStatus,
    Task,
)

__all__ = ["Trainer", "TrainResult", "collect_samples"]

log = logging.getLogger(__name__)


@dataclass
class _Collected:
    samples: list[RolloutSample] = field(default_factory=list[RolloutSample])
    rewards: list[float] = field(default_factory=list[float])
    used_tool: list[bool] = field(default_factory=list[bool])
    """Per scored rollout (parallel to ``rewards``): whether any of its LLM calls called a tool."""
    failed: int = 0
    timed_out: int = 0
    n_calls: int = 0
    n_untrainable: int = 0
    n_truncated: int = 0
    response_tokens: int = 0
    """Summed over the trainable calls (the transitions), as is ``n_responses``."""
    n_responses: int = 0
    role_calls: list[RoleCall] = field(default_factory=list[RoleCall])
    """Every model call of the scored rollouts, trainable or not, for the per-role view."""

    def rollout_metrics(self, prefix: str) -> dict[str, float]:
        """Tool-use rates and the mean response length of the scored rollouts, under ``prefix/``."""
        return {
            **tool_call_metrics(prefix, self.rewards, self.used_tool),
            f"{prefix}/response_tokens_mean": (
                self.response_tokens / self.n_responses if self.n_responses else float("nan")
            ),
        }


async def collect_samples(
    store: LightningStore,
    rollouts: Sequence[Rollout],
    *,
    trainable: RoleSelector | None,
    air: AIRPolicy,
    missing_reward: float | None = None,
) -> _Collected:
    """Turn finished rollouts into rollout samples. Failed / timed-out ones are counted, never scored 0.

    A succeeded rollout without a reward is excluded too, unless ``missing_reward`` is given (NaN
    when a judge supplies every reward): it then gets that value.
    """
    out = _Collected()
    for rollout in rollouts:
        if rollout.status is RolloutStatus.TIMED_OUT:
            out.timed_out += 1
            continue
        if rollout.status is not RolloutStatus.SUCCEEDED:
            out.failed += 1
            continue
        attempts = await store.query_attempts(rollout.id)
        attempt = attempts[-1]
        spans = await store.query_spans(attempt_id=attempt.id)
        reward = final_reward(rollout, spans)
        if reward is None and missing_reward is not None:
            reward = missing_reward
        if reward is None:
            out.failed += 1
            log.warning("rollout %s succeeded without a reward; excluded (return one or call emit_reward)", rollout.id)
            continue
        adapted = adapt_attempt(rollout, attempt.id, spans, trainable=trainable, air=air)
        out.rewards.append(reward)
        out.used_tool.append(has_tool_call(spans))
        out.n_calls += adapted.n_calls
        out.n_untrainable += adapted.n_untrainable
        out.n_truncated += adapted.n_truncated
        out.response_tokens += sum(len(t.response_ids) for t in adapted.transitions)
        out.n_responses += len(adapted.transitions)
        out.role_calls += role_calls(rollout, attempt.id, spans, adapted, air=air)
        out.samples.append(RolloutSample(rollout.id, rollout.group_id or rollout.id, reward, adapted.transitions))
    return out


class Trainer:
    """Runs LightningRL on the embedded services. See ``TrainerConfig`` for every knob.

    An ``Algorithm`` (``lightning_rl.algorithms``): registered as ``grpo``, ``rloo`` and ``ppo``; SFT
    and DPO are this loop with another ``update_rule``.
    """

    config_class: ClassVar[type[TrainerConfig]] = TrainerConfig

    def __init__(self, config: TrainerConfig | None = None, *, trainable: RoleSpec = None) -> None:
        self.config = config or self.config_class()
        # None: each role as the plugins declared it (instrument(trainable=...)), else trainable.
        self.trainable = None if trainable is None else RoleSelector.of(trainable)
        self.run_dir = Path(self.config.run_dir)
        self.update_rule: UpdateRule = make_update_rule(self.config)
        judge = self.config.judge
        self.judge = GroupJudge(judge, cache_dir=self.run_dir / "judge_cache") if judge else None
        self._warned_undeclared = False

    def fit(self, agent: AgentFn | None, train_tasks: Sequence[Task], val_tasks: Sequence[Task] = ()) -> TrainResult:
        """Train ``agent`` on ``train_tasks``; report held-out reward on ``val_tasks`` before and after.

        ``agent`` may be None with ``concurrency=0``: runner processes started separately run it.
        """
        return asyncio.run(self.fit_async(agent, train_tasks, val_tasks))

    async def fit_async(
        self, agent: AgentFn | None, train_tasks: Sequence[Task], val_tasks: Sequence[Task] = ()
    ) -> TrainResult:
        cfg = self.config
        if not train_tasks:
            raise ValueError("fit() needs at least one training task.")
        map_large_blocks()  # KV caches and logits come and go every step: mapped, never fragmenting arenas
        bound_kernel_cache()  # bfloat16 matmuls keep state per shape, and every step brings new shapes
        self.run_dir.mkdir(parents=True, exist_ok=True)
        public = json.loads(json.dumps(asdict(cfg), default=str))
        if cfg.judge is not None and cfg.judge.api_key:
            public["judge"]["api_key"] = "***"  # a key in the config never reaches the run folder or the sinks
        (self.run_dir / "config.json").write_text(json.dumps(public, indent=2))
        metrics = MetricsLogger(
            self.run_dir,
            tensorboard=cfg.tensorboard,
            loggers=cfg.loggers,
            config=public,
            logger_options=cfg.logger_options,
        )
        train_tasks = [_with_id(t, f"train-{i}") for i, t in enumerate(train_tasks)]
        val_tasks = [_with_id(t, f"val-{i}") for i, t in enumerate(val_tasks)]
        try:
            with StepProgress(cfg.steps, enabled=cfg.progress) as bar:
                val_before, val_after = await self._run(agent, train_tasks, val_tasks, metrics, bar)
        finally:  # a failed run still closes its W&B / MLflow run (with what it logged)
            metrics.close()
        plot_reward_curve(metrics.history, self.run_dir / "reward_curve.png")
        return TrainResult(self.run_dir, val_before, val_after, metrics.history)

    def evaluate(self, agent: AgentFn, tasks: Sequence[Task]) -> float:
        """Mean reward of ``agent`` on ``tasks`` (one rollout each, at ``val_temperature``) with the
        configured model, without training: the held-out score of weights that something else made
        (a fine-tuned checkpoint chosen on a validation split). Logged to ``<run_dir>/metrics.jsonl``
        as a ``val/*`` row of step 0, as ``fit`` logs its first validation.

        Raises:
            ValueError: ``tasks`` is empty.
        """
        return asyncio.run(self.evaluate_async(agent, tasks))

    async def evaluate_async(self, agent: AgentFn, tasks: Sequence[Task]) -> float:
        """``evaluate`` inside a running event loop."""
        if not tasks:
            raise ValueError("evaluate() needs at least one task.")
        cfg = self.config
        self.run_dir.mkdir(parents=True, exist_ok=True)
        metrics = MetricsLogger(self.run_dir, tensorboard=False, loggers=cfg.loggers, logger_options=cfg.logger_options)
        tasks = [_with_id(t, f"val-{i}") for i, t in enumerate(tasks)]
        try:
            with StepProgress(0, enabled=False) as bar:
                async with self._services(agent) as svc:
                    return await self._validate(svc, tasks, 0, metrics, bar)
        finally:
            metrics.close()

    async def _run(
        self,
        agent: AgentFn | None,
        train_tasks: Sequence[Task],
        val_tasks: Sequence[Task],
        metrics: MetricsLogger,
        bar: StepProgress,
    ) -> tuple[float | None, float | None]:
        """Start the services, then validate / train / validate; returns held-out reward before and after."""
        cfg = self.config
        rng = random.Random(cfg.seed)
        async with self._services(agent) as svc:
            if cfg.concurrency == 0:
                bar.note(
                    "waiting for external runners: lightning-rl runner "
                    f"--store {cfg.store or self.run_dir / 'store.sqlite'} --agent <module:function>"
                )
            first_step = self._maybe_resume(svc)
            if first_step > 0:
                await svc.backend.publish()
            bar.advance_to(first_step)
            val_before = await self._validate(svc, val_tasks, first_step, metrics, bar) if val_tasks else None
            val_after = val_before
            last, trained_s = first_step, 0.0
            for step in range(first_step + 1, cfg.steps + 1):
                row = await self._train_step(svc, step, rng.sample(train_tasks, min(cfg.batch_size, len(train_tasks))))
                last, trained_s = step, trained_s + row["train/step_s"]
                row["train/elapsed_s"] = trained_s  # training time so far, validation excluded
                # the time budget counts training only, so validation never eats into it; no step starts
                # that would end past it if it took as long as this one (steps grow as episodes lengthen:
                # "start while under budget" once let a 20-minute arm train 27)
                out_of_time = cfg.time_budget_s is not None and trained_s + row["train/step_s"] > cfg.time_budget_s
                final = step == cfg.steps or out_of_time
                if val_tasks and cfg.val_every and step % cfg.val_every == 0 and not final:
                    val_after = await self._validate(svc, val_tasks, step, metrics, bar)
                metrics.log(row)
                bar.step_done(row)
                if cfg.checkpoint_every and step % cfg.checkpoint_every == 0:
                    self._checkpoint(svc, step)
                if out_of_time:
                    bar.note(f"time budget of {cfg.time_budget_s:.0f} s reached after step {step}")
                    break
            if val_tasks:
                val_after = await self._validate(svc, val_tasks, last, metrics, bar)
            self._checkpoint(svc, last)
        return val_before, val_after

    def _services(self, agent: AgentFn | None) -> AbstractAsyncContextManager[Services]:
        """The store, gateway, backend and runner of this run (``VerlTrainer`` swaps in VeRL's)."""
        frozen = self._is_frozen if self.config.untrainable_roles == "frozen" else None
        return start_services(self.config, agent, frozen)

    def _is_frozen(self, role: str | None) -> bool:
        """Whether a call of ``role`` is answered by the frozen weights (``untrainable_roles="frozen"``):
        the role is not trainable by ``Trainer(trainable=...)``, or, without it, by the plugins'
        declarations (a role no plugin selected, once some role was selected)."""
        if self.trainable is not None:
            return not self.trainable(role)
        declared = declared_trainable(role)
        if declared is None and not self._warned_undeclared:
            self._warned_undeclared = True
            log.warning(
                "untrainable_roles='frozen', but no trainable role is known when a call arrives: pass "
                "Trainer(trainable=...) or call the plugin's instrument(trainable=...); until then every "
                "call is answered by the policy"
            )
        return declared is False

    # --- one step, top to bottom --------------------------------------------------------------
    async def _train_step(self, svc: Services, step: int, tasks: Sequence[Task]) -> dict[str, float]:
        cfg = self.config
        t0 = time.perf_counter()
        memory = PeakMemory()  # which phase of the step the process's peak resident memory belongs to
        # 1. publish resources: the endpoint, sampling and weights version the rollouts of this step run with
        resources = await self._publish(svc, cfg.temperature)
        # 2. enqueue each task group_size times; one group id per task so GRPO compares like with like
        requests = [
            RolloutRequest(
                id=f"{svc.run_id}-s{step}-t{i}-{k}",
                task=task,
                group_id=f"s{step}-{task.id}",
                resources_version=resources.version,
                config=self._rollout_config(),
            )
            for i, task in enumerate(tasks)
            for k in range(cfg.group_size)
        ]
        await svc.store.enqueue(requests)
        # 3. wait for the group; stragglers are cancelled and counted, never silently scored
        finished = await self._wait(svc, [r.id for r in requests])
        t_rollouts = time.perf_counter() - t0
        memory.phase("rollouts")
        release_free_memory()  # the rollouts' KV caches, freed: not part of the update's peak
        # 4. adapt spans -> transitions (exact token ids from the gateway), trainable roles only
        # (with a judge at full weight the agent need not emit a reward: NaN until the judge scores it)
        unrewarded = math.nan if self.judge is not None and self.judge.config.weight == 1.0 else None
        collected = await collect_samples(
            svc.store, finished, trainable=self.trainable, air=cfg.air, missing_reward=unrewarded
        )
        retokenize_samples(collected.samples, svc.engine)  # issue 25: captured text-only calls -> policy token ids
        # 4b. a judge, when configured, scores each group's rollouts against each other; a group it
        # could not score is left out of the update and counted (lightning_rl.rewards)
        samples, judged = collected.samples, {}
        if self.judge is not None:
            result = await judge_samples(self.judge, svc.store, finished, collected.samples)
            samples, judged = result.samples, result.metrics
        # 5-6. the update rule picks what to train on: for RL, credit assignment and per-rollout
        # group advantages; for SFT, the best attempts; for DPO, preference pairs
        batch = self.update_rule.prepare(samples)
        # 7. update the policy (in a thread: the gateway and runner keep their event loop)
        update: dict[str, float] = {}
        if batch.items:
            update = await asyncio.to_thread(self.update_rule.apply, svc.backend, batch)
        memory.phase("update")
        # 8. publish the new weights to the engine; later rollouts record the new version
        version = await svc.backend.publish()
        memory.phase("publish")
        release_free_memory()  # the step's freed KV caches, spans and weight copies (lightning_rl.memory)
        floor = memory_breakdown()  # what the memory left between steps is made of
        rewards = collected.rewards
        own = [r for r in rewards if not math.isnan(r)]  # the agent's own rewards (a judge's are train/judge_*)
        return {
            "step": float(step),
            "train/reward_mean": statistics.fmean(own) if own else float("nan"),
            "train/reward_std": statistics.pstdev(own) if len(own) > 1 else 0.0,
            "train/n_rollouts": float(len(rewards)),
            "train/failed_rollouts": float(collected.failed),
            "train/timed_out_rollouts": float(collected.timed_out),
            "train/n_transitions": float(batch.n_transitions),
            "train/n_updated_transitions": float(batch.n_updated),
            **batch.metrics,
            **judged,
            **collected.rollout_metrics("train"),
            "train/untrainable_calls": float(collected.n_untrainable),
            "train/truncated_calls": float(collected.n_truncated),
            **role_metrics("train", collected.role_calls),
            "train/rollout_s": t_rollouts,
            "train/rollout_tokens_per_s": collected.response_tokens / t_rollouts if t_rollouts > 0 else 0.0,
            "train/step_s": time.perf_counter() - t0,
            "model_version": float(version),
            **update,
            **memory.metrics(),
            **{f"mem/step_end/{kind}_gb": gb for kind, gb in floor.items()},
        }

    async def _validate(
        self, svc: Services, tasks: Sequence[Task], step: int, metrics: MetricsLogger, bar: StepProgress
    ) -> float:
        """Mean reward on held-out tasks (one rollout each) with the current weights."""
        cfg = self.config
        temperature = cfg.val_temperature if cfg.val_temperature is not None else cfg.temperature
        resources = await self._publish(svc, temperature)
        memory = PeakMemory()
        requests = [
            RolloutRequest(
                id=f"{svc.run_id}-v{resources.version}-t{i}",
                task=task,
                group_id=f"v{step}-{task.id}",
                mode="val",
                resources_version=resources.version,
                config=self._rollout_config(),
            )
            for i, task in enumerate(tasks)
        ]
        await svc.store.enqueue(requests)
        finished = await self._wait(svc, [r.id for r in requests])
        # AIR trains nothing here; it feeds the per-role view (val/role/<role>/air_mean)
        collected = await collect_samples(svc.store, finished, trainable=self.trainable, air=cfg.air)
        memory.phase("validation")
        mean = statistics.fmean(collected.rewards) if collected.rewards else float("nan")
        metrics.log(
            {
                "step": float(step),
                "val/reward_mean": mean,
                "val/n_rollouts": float(len(collected.rewards)),
                "val/failed_rollouts": float(collected.failed + collected.timed_out),
                "val/tool_call_rate": tool_call_metrics("val", collected.rewards, collected.used_tool)[
                    "val/tool_call_rate"
                ],
                **role_metrics("val", collected.role_calls, trained_name="trainable_transitions"),
                **memory.metrics(),
            }
        )
        bar.note(f"[bold]step {step}[/] held-out reward {mean:.3f} over {len(collected.rewards)} tasks")
        release_free_memory()
        return mean

    # --- helpers ------------------------------------------------------------------------------
    def _llm(self, svc: Services, temperature: float) -> LLMResource:
        cfg = self.config
        sampling: dict[str, Any] = {"temperature": temperature, "top_p": cfg.top_p, "max_tokens": cfg.max_tokens}
        return LLMResource(base_url=svc.gateway_url, model=svc.model_name, sampling=sampling)

    async def _publish(self, svc: Services, temperature: float) -> Resources:
        """A new resources version for the next rollouts (retried through a store outage)."""
        llm, extra = self._llm(svc, temperature), self._weights(svc)
        return await publish_resources(svc.store, llm=llm, extra=extra, retry_s=self.config.store_retry_s)

    def _weights(self, svc: Services) -> dict[str, object]:
        """What a resources version records about the weights: the version the engine serves and
        the update rule that produced it (the store's resources history is the run's model history)."""
        return {"model_version": svc.backend.version, "update_rule": self.config.update_rule}

    def _rollout_config(self) -> RolloutConfig:
        cfg = self.config
        return RolloutConfig(
            timeout_s=cfg.rollout_timeout_s,
            heartbeat_timeout_s=cfg.heartbeat_timeout_s,
            max_attempts=cfg.max_attempts,
        )

    async def _wait(self, svc: Services, ids: list[str]) -> list[Rollout]:
        finished = await svc.store.wait_for_rollouts(ids, self.config.step_timeout_s)
        if len(finished) < len(ids):
            done = {r.id for r in finished}
            late = [i for i in ids if i not in done]
            log.warning(
                "%d rollouts did not finish within %.0f s; cancelling them", len(late), self.config.step_timeout_s
            )
            await svc.store.cancel(late)
            finished = await svc.store.query_rollouts(ids=ids, limit=max(len(ids), 1))
        # the gateway writes spans off the request path: make sure this step's spans are in the store
        await svc.flush_spans()
        # in the order they were asked for, not the order they ended: the update's micro-batches,
        # and so its float sums, must not depend on which rollout finished first
        order = {rid: i for i, rid in enumerate(ids)}
        return sorted(finished, key=lambda r: order.get(r.id, len(order)))

    def _checkpoint(self, svc: Services, step: int) -> None:
        path = svc.backend.save_checkpoint(self.run_dir / "checkpoints" / f"step_{step:05d}")
        # written aside and renamed: a kill mid-write must not leave an empty marker (resume would fail)
        partial = self.run_dir / "checkpoints" / "latest.partial"
        partial.write_text(str(path.parent.name))
        os.replace(partial, self.run_dir / "checkpoints" / "latest")

    def _maybe_resume(self, svc: Services) -> int:
        marker = self.run_dir / "checkpoints" / "latest"
        if not self.config.resume or not marker.exists():
            return 0
        folder = self.run_dir / "checkpoints" / marker.read_text().strip()
        svc.backend.load_checkpoint(folder)
        step = int(folder.name.removeprefix("step_"))
        log.info("resumed from %s (step %d)", folder, step)
        return step


def _with_id(task: Task, default: str) -> Task:
    return task if task.id else task.model_copy(update={"id": default})
