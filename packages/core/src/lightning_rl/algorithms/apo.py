"""APO: automatic prompt optimisation by critique, edit and beam search over prompt templates.

The agent reads its prompt template from the resources its rollout runs with
(:func:`prompt_template`), so each candidate prompt is just another **resources version** in the
store, and evaluating a candidate is enqueueing rollouts pinned to that version. Every round:

1. **propose**: for each prompt in the beam, the optimiser LLM reads transcripts of the rollouts it
   scored worst on (their spans rendered as text), writes a critique, and edits the prompt; the
   edits become new candidates (new resources versions, parent and critique in ``extra``);
2. **evaluate**: the beam and the new candidates run on the same fresh batch of training tasks,
   all of them enqueued at once, so the ordinary runners execute them side by side;
3. **select**: the ``beam_width`` best mean rewards survive (ties keep the older prompt);
4. **record**: a resources version carrying the best prompt so far and every candidate's score
   history (``extra["apo"]``) is published, so the store's latest resources are always the best
   prompt found, and ``metrics.jsonl`` gets one row per round.

Before the first round the initial prompt is evaluated (its failures seed the first critiques);
with validation tasks, the initial and the final best prompt are also scored on them
(``val_before`` / ``val_after``). Rollouts that fail or time out are counted and, for ranking,
scored ``failed_reward`` (0 by default: a prompt that crashes the agent is a bad prompt).

The optimiser is any OpenAI-compatible endpoint (``optimizer_base_url``/``optimizer_model``, key
from the config or ``LIGHTNING_APO_API_KEY`` / ``OPENAI_API_KEY``); by default it is the model the
gateway serves, which makes a fully offline run possible (weak with the tiny model, but real).
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
import uuid
from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from lightning_rl.adapter import final_reward
from lightning_rl.agent import AgentFn
from lightning_rl.algorithms.apo_optimizer import Edit, OptimizerClient, OptimizerError, template_fields
from lightning_rl.algorithms.apo_render import render_rollout
from lightning_rl.algorithms.apo_services import APOServices, start_apo_services
from lightning_rl.algorithms.base import TrainResult
from lightning_rl.store.base import LightningStore
from lightning_rl.tracing import current_rollout
from lightning_rl.types import LLMResource, Resources, Rollout, RolloutConfig, RolloutRequest, RolloutStatus, Task

__all__ = [
    "APO",
    "APOConfig",
    "APOResult",
    "Candidate",
    "Evaluation",
    "prompt_template",
    "load_apo_state",
    "API_KEY_ENV",
    "LLM_API_KEY_ENV",
]

log = logging.getLogger(__name__)

API_KEY_ENV = ("LIGHTNING_APO_API_KEY", "OPENAI_API_KEY")
"""Environment variables read, in order, for the optimiser's API key when the config sets none."""
LLM_API_KEY_ENV = ("LIGHTNING_APO_LLM_API_KEY", "OPENAI_API_KEY")
"""The same for the agent's model server (``llm_base_url``)."""


def prompt_template(name: str = "system", default: str | None = None) -> str:
    """The prompt template ``name`` of the resources the current rollout runs with.

    Call it inside the agent: under APO each rollout runs one candidate prompt. Outside a rollout,
    or when the resources have no such prompt, ``default`` is returned if given.

    Raises:
        LookupError: No prompt ``name`` and no default.
    """
    ctx = current_rollout()
    if ctx is not None and ctx.resources is not None and name in ctx.resources.prompts:
        return ctx.resources.prompts[name]
    if default is not None:
        return default
    where = "outside any rollout" if ctx is None else f"in the resources of rollout {ctx.rollout_id}"
    raise LookupError(
        f"no prompt template {name!r} {where}; publish it (store.add_resources(prompts={{{name!r}: ...}})) "
        "or pass a default."
    )


@dataclass
class APOConfig:
    """Everything APO needs besides the agent and the tasks."""

    initial_prompt: str = "You are a helpful assistant."
    """The template to start from. ``{field}`` placeholders are kept by every edit."""
    prompt_name: str = "system"
    """The name the agent reads the template under (``prompt_template(name)``)."""
    rounds: int = 3
    """Rounds of propose -> evaluate -> select."""
    beam_width: int = 2
    """Prompts kept after each round."""
    candidates_per_round: int = 4
    """New prompts the optimiser writes per round, spread over the beam (best prompt first)."""
    tasks_per_eval: int = 8
    """Training tasks each candidate runs on per round (the same batch for every candidate)."""
    concurrency: int = 32
    """Rollouts the in-process runner runs at once (all candidates of a round share it)."""
    failures_per_critique: int = 3
    """Worst-scoring transcripts shown to the optimiser per critique."""
    failure_threshold: float = 1.0
    """A rollout scoring below this is a failure worth showing the optimiser."""
    failed_reward: float | None = 0.0
    """Score of a rollout that failed or timed out when ranking candidates (None: left out of the mean)."""
    transcript_chars: int = 3000
    """Most characters of one rendered transcript (each message within it is cut at a third of this)."""
    optimizer_base_url: str | None = None
    """The optimiser's OpenAI-compatible base URL (ending in ``/v1``). None: the gateway's own model."""
    optimizer_model: str | None = None
    """The optimiser's model name. None: the model the gateway serves."""
    optimizer_api_key: str | None = None
    """The optimiser's API key. None: ``LIGHTNING_APO_API_KEY``, then ``OPENAI_API_KEY`` (may be unset locally)."""
    optimizer_temperature: float = 0.7
    optimizer_max_tokens: int = 512
    model: str = "tiny"
    """The agent's model on the embedded engine (``tiny``, ``smollm2-135m``, an HF folder) when
    ``llm_base_url`` is not set."""
    llm_base_url: str | None = None
    """An OpenAI-compatible server for the agent's model instead of the embedded engine (behind the gateway)."""
    llm_model: str | None = None
    """The upstream's model name (None: the first it lists)."""
    llm_api_key: str | None = None
    """The upstream's API key (None: ``LIGHTNING_APO_LLM_API_KEY``, then ``OPENAI_API_KEY``, if set)."""
    temperature: float = 0.0
    """Sampling temperature of the agent's calls (0: greedy, so scores differ by prompt, not by luck)."""
    max_tokens: int = 128
    """Most tokens per agent model call."""
    device: str = "cpu"
    rollout_timeout_s: float = 120.0
    """Limit of one rollout, enforced by the store."""
    eval_timeout_s: float = 900.0
    """How long to wait for one evaluation's rollouts; stragglers are cancelled and counted."""
    run_dir: str = "runs/apo"
    """Where the store, metrics, reward curve and the candidates go."""
    seed: int = 0
    """Seeds the task batches (and nothing else: the optimiser's sampling is its server's)."""
    tensorboard: bool = False
    """Mirror metrics to TensorBoard when it is installed."""
    progress: bool = True
    """Print one line per round."""

    def __post_init__(self) -> None:
        for name in ("rounds", "beam_width", "tasks_per_eval", "concurrency", "failures_per_critique"):
            if getattr(self, name) < 1:
                raise ValueError(f"APOConfig.{name} must be >= 1, got {getattr(self, name)}.")
        if self.candidates_per_round < 0:
            raise ValueError(f"APOConfig.candidates_per_round must be >= 0, got {self.candidates_per_round}.")
        if not self.prompt_name:
            raise ValueError("APOConfig.prompt_name must be a non-empty string, e.g. 'system'.")
        if not self.initial_prompt.strip():
            raise ValueError("APOConfig.initial_prompt is empty; give the template to start from.")
        if self.transcript_chars < 200:
            raise ValueError(f"APOConfig.transcript_chars must be >= 200, got {self.transcript_chars}.")

    def resolved_api_key(self) -> str | None:
        """The optimiser's API key: the config's, else the first of ``API_KEY_ENV`` that is set."""
        if self.optimizer_api_key:
            return self.optimizer_api_key
        return next((os.environ[v] for v in API_KEY_ENV if os.environ.get(v)), None)

    def resolved_llm_api_key(self) -> str | None:
        """The agent upstream's API key: the config's, else the first of ``LLM_API_KEY_ENV`` that is set."""
        if self.llm_api_key:
            return self.llm_api_key
        return next((os.environ[v] for v in LLM_API_KEY_ENV if os.environ.get(v)), None)

    def public_dict(self) -> dict[str, Any]:
        """The config as written to ``config.json`` and the store: API keys replaced by ``***``."""
        data = asdict(self)
        for key in ("optimizer_api_key", "llm_api_key"):
            if data[key]:
                data[key] = "***"
        return data


@dataclass
class Candidate:
    """One prompt template APO considered, and how it scored."""

    id: str
    template: str
    version: int
    """The resources version that carries it."""
    parent: str | None = None
    round: int = 0
    """The round it was written in (0: the initial prompt)."""
    critique: str | None = None
    """The optimiser's critique of the parent that this edit answers."""
    scores: dict[int, float] = field(default_factory=dict[int, float])
    """Round -> mean reward on that round's batch (the same batch for every candidate of the round)."""
    worst: list[tuple[Rollout, float | None]] = field(default_factory=list[tuple[Rollout, float | None]], repr=False)
    """Its worst rollouts (and rewards; None: failed) in its latest evaluation, worst first: what the
    optimiser reads next, rendered only if the candidate survives (``APO.transcripts``)."""

    def record(self) -> dict[str, Any]:
        """The candidate as stored (``extra["apo"]["candidates"]``) and written to ``candidates.json``."""
        return {
            "id": self.id,
            "version": self.version,
            "parent": self.parent,
            "round": self.round,
            "template": self.template,
            "critique": self.critique,
            "scores": {str(k): (None if math.isnan(v) else v) for k, v in self.scores.items()},
        }


@dataclass
class Evaluation:
    """One candidate on one batch of tasks."""

    candidate: str
    score: float
    """Mean reward (failed rollouts count as ``failed_reward``); NaN when nothing could be scored."""
    rewards: list[float]
    """Rewards of the rollouts that produced one."""
    failed: int
    """Rollouts that failed, timed out or returned no reward."""
    worst: list[tuple[Rollout, float | None]]
    """Rollouts below ``failure_threshold`` or failed (with their rewards), worst first, at most
    ``failures_per_critique``."""
    rollout_ids: list[str]


@dataclass
class APOResult(TrainResult):
    """What a finished APO run reports (the ``TrainResult`` of every algorithm, plus the prompts);
    the round-by-round history is in ``<run_dir>/metrics.jsonl``."""

    best_prompt: str
    best_version: int
    """The resources version that carries the best prompt with its id (its candidate's version)."""
    candidates: list[Candidate]


async def load_apo_state(store: LightningStore) -> dict[str, Any] | None:
    """The APO record of the latest resources version that has one (best prompt, beam, candidate
    scores), or None if APO never ran on ``store``."""
    latest = await store.get_resources()
    for version in range(latest.version, 0, -1):
        res = latest if version == latest.version else await store.get_resources(version)
        state = res.extra.get("apo")
        if isinstance(state, dict) and "candidates" in state:
            return dict(state)  # pyright: ignore[reportUnknownArgumentType]
    return None


class APO:
    """Automatic prompt optimisation over the ordinary rollout path. See ``APOConfig`` for every knob.

    Args:
        config: The run's settings.
        store: Use this store instead of a SQLite file in ``run_dir`` (it is not closed).
    """

    config_class = APOConfig

    def __init__(self, config: APOConfig | None = None, *, store: LightningStore | None = None) -> None:
        self.config = config or APOConfig()
        self.run_dir = Path(self.config.run_dir)
        self._store = store
        self._run_id = uuid.uuid4().hex[:8]
        self._candidates: list[Candidate] = []
        self._evaluations = 0

    # --- entry points -------------------------------------------------------------------------
    def fit(self, agent: AgentFn | None, train_tasks: Sequence[Task], val_tasks: Sequence[Task] = ()) -> APOResult:
        """Optimise the prompt ``agent`` reads on ``train_tasks``; score the initial and the best
        prompt on ``val_tasks`` (when given)."""
        return asyncio.run(self.fit_async(agent, train_tasks, val_tasks))

    def services(self, agent: AgentFn) -> AbstractAsyncContextManager[APOServices]:
        """The store, gateway and runner of this run, for ``evaluate`` outside ``fit``."""
        return start_apo_services(self.config, agent, self._store)

    async def fit_async(
        self, agent: AgentFn | None, train_tasks: Sequence[Task], val_tasks: Sequence[Task] = ()
    ) -> APOResult:
        """``fit`` on the running event loop."""
        from lightning_rl.trainer.metrics import MetricsLogger, plot_reward_curve

        cfg = self.config
        if agent is None:
            raise ValueError("APO runs the agent in-process: pass it to fit() (external runners are not supported).")
        if not train_tasks:
            raise ValueError("APO.fit needs at least one training task.")
        self._run_id, self._candidates = uuid.uuid4().hex[:8], []  # a second fit() is a new run
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "config.json").write_text(json.dumps(cfg.public_dict(), indent=2))
        metrics = MetricsLogger(self.run_dir, tensorboard=cfg.tensorboard)
        train = [t if t.id else t.model_copy(update={"id": f"train-{i}"}) for i, t in enumerate(train_tasks)]
        val = [t if t.id else t.model_copy(update={"id": f"val-{i}"}) for i, t in enumerate(val_tasks)]
        try:
            async with self.services(agent) as svc:
                val_before, val_after, best = await self._run(svc, train, val, metrics)
        finally:
            metrics.close()
        plot_reward_curve(metrics.history, self.run_dir / "reward_curve.png")
        (self.run_dir / "candidates.json").write_text(
            json.dumps([c.record() for c in self._candidates], indent=2, ensure_ascii=False)
        )
        # Exact bytes: an edited prompt may hold "\r", which text-mode newline translation would change.
        (self.run_dir / "best_prompt.txt").write_bytes(best.template.encode("utf-8"))
        return APOResult(
            self.run_dir, val_before, val_after, metrics.history, best.template, best.version, list(self._candidates)
        )

    # --- the loop, top to bottom --------------------------------------------------------------
    async def _run(
        self, svc: APOServices, train: list[Task], val: list[Task], metrics: Any
    ) -> tuple[float | None, float | None, Candidate]:
        cfg = self.config
        rng = random.Random(cfg.seed)
        optimizer = self._optimizer(svc)
        try:
            initial = await self.add_candidate(svc, cfg.initial_prompt)
            val_before = await self._validate(svc, initial, val, 0, metrics) if val else None
            # round 0: score the initial prompt; its worst rollouts seed the first critiques
            batch = self._batch(rng, train)
            [first] = (await self.evaluate(svc, [initial], batch, round_=0)).values()
            beam = [initial]
            metrics.log(self._round_row(0, [first], beam, new=0, rejected=0, errors=0, eval_s=0.0, opt_s=0.0))
            await self._publish_state(svc, 0, beam)
            for round_ in range(1, cfg.rounds + 1):
                # 1. propose: critique + edit each beam prompt from its worst transcripts, in parallel
                t0 = time.perf_counter()
                new, rejected, errors = await self._propose(svc, optimizer, beam, round_)
                opt_s = time.perf_counter() - t0
                # 2. evaluate the beam and the new prompts on one fresh batch, all rollouts at once
                t0 = time.perf_counter()
                evals = await self.evaluate(svc, [*beam, *new], self._batch(rng, train), round_=round_)
                eval_s = time.perf_counter() - t0
                # 3. select: the best mean rewards survive; a tie keeps the older prompt
                pool = [*beam, *new]
                ranked = sorted(pool, key=lambda c: (-_rank_score(evals[c.id].score), self._candidates.index(c)))
                beam = ranked[: cfg.beam_width]
                # 4. record: metrics row, and the best prompt + score history as the latest resources
                row = self._round_row(round_, list(evals.values()), beam, len(new), rejected, errors, eval_s, opt_s)
                metrics.log(row)
                await self._publish_state(svc, round_, beam)
                self._say(f"round {round_}: best {beam[0].id} {row['train/reward_mean']:.3f} ({len(new)} new)")
            best = beam[0]
            val_after = await self._validate(svc, best, val, cfg.rounds, metrics) if val else None
            await self._publish_state(svc, cfg.rounds, beam, val_before=val_before, val_after=val_after)
        finally:
            await optimizer.aclose()
        return val_before, val_after, best

    async def _propose(
        self, svc: APOServices, optimizer: OptimizerClient, beam: list[Candidate], round_: int
    ) -> tuple[list[Candidate], int, int]:
        """New candidates edited from the beam's prompts; also how many edits were rejected or failed."""
        cfg = self.config
        parents = [p for p in beam if p.worst]  # a prompt with no failures has nothing to fix
        if not parents or cfg.candidates_per_round == 0:
            return [], 0, 0
        texts = await asyncio.gather(*(self.transcripts(svc.store, p) for p in parents))
        failures = {p.id: t for p, t in zip(parents, texts, strict=True)}
        slots = [parents[i % len(parents)] for i in range(cfg.candidates_per_round)]
        results = await asyncio.gather(
            *(optimizer.edit(p.template, failures[p.id]) for p in slots), return_exceptions=True
        )
        errors = [r for r in results if isinstance(r, BaseException)]
        for exc in errors:
            if not isinstance(exc, OptimizerError):
                raise exc
        if errors and len(errors) == len(results):
            raise OptimizerError(f"every optimiser call of round {round_} failed; the first: {errors[0]}")
        new: list[Candidate] = []
        rejected = 0
        for parent, result in zip(slots, results, strict=True):
            if isinstance(result, BaseException):
                log.warning("optimiser edit of %s failed: %s", parent.id, result)
                continue
            problem = self._edit_problem(parent, result)
            if problem:
                rejected += 1
                log.info("edit of %s rejected: %s", parent.id, problem)
                continue
            new.append(
                await self.add_candidate(
                    svc, result.template, parent=parent.id, round_=round_, critique=result.critique
                )
            )
        return new, rejected, len(errors)

    def _edit_problem(self, parent: Candidate, edit: Edit) -> str | None:
        """Why an edit cannot become a candidate, or None."""
        if not edit.template.strip():
            return "the optimiser returned an empty prompt"
        if any(c.template == edit.template for c in self._candidates):
            return "the same prompt was already evaluated"
        missing = template_fields(parent.template) - template_fields(edit.template)
        if missing:
            return f"it drops the placeholders {sorted(missing)}"
        return None

    # --- building blocks (also used by the benchmark) ----------------------------------------
    async def add_candidate(
        self,
        svc: APOServices,
        template: str,
        *,
        parent: str | None = None,
        round_: int = 0,
        critique: str | None = None,
    ) -> Candidate:
        """Publish ``template`` as a new resources version and remember it as a candidate."""
        cid = f"c{len(self._candidates)}"
        extra: dict[str, object] = {
            "apo_candidate": {"id": cid, "parent": parent, "round": round_, "critique": critique}
        }
        res = await svc.store.add_resources(
            llm=self._llm(svc), prompts={self.config.prompt_name: template}, extra=extra
        )
        cand = Candidate(id=cid, template=template, version=res.version, parent=parent, round=round_, critique=critique)
        self._candidates.append(cand)
        return cand

    async def evaluate(
        self,
        svc: APOServices,
        candidates: Sequence[Candidate],
        tasks: Sequence[Task],
        *,
        round_: int,
        mode: str = "train",
    ) -> dict[str, Evaluation]:
        """Run every candidate on every task, **all rollouts enqueued at once**, and score them.

        Scores are stored on the candidates (``scores[round_]``) and their worst transcripts kept
        for the next critique (for training evaluations).
        """
        cfg = self.config
        self._evaluations += 1  # in the rollout ids: evaluating a candidate again never reuses old rollouts
        tag = f"e{self._evaluations}-r{round_}" if mode == "train" else f"e{self._evaluations}-{mode}{round_}"
        requests = [
            RolloutRequest(
                id=f"apo-{self._run_id}-{tag}-{c.id}-t{i}",
                task=task,
                group_id=f"apo-{tag}-{task.id or i}",
                mode="val" if mode == "val" else "train",
                resources_version=c.version,
                config=RolloutConfig(timeout_s=cfg.rollout_timeout_s, max_attempts=1),
                metadata={"apo_round": round_, "apo_candidate": c.id},
            )
            for c in candidates
            for i, task in enumerate(tasks)
        ]
        await svc.store.enqueue(requests)
        ids = [r.id for r in requests]
        finished = await svc.store.wait_for_rollouts(ids, cfg.eval_timeout_s)
        if len(finished) < len(ids):
            done = {r.id for r in finished}
            late = [i for i in ids if i not in done]
            log.warning("%d APO rollouts did not finish within %.0f s; cancelling them", len(late), cfg.eval_timeout_s)
            await svc.store.cancel(late)
            finished = await svc.store.query_rollouts(ids=ids, limit=len(ids))
        await svc.flush_spans()  # the gateway records off the request path: the transcripts must be complete
        by_candidate: dict[str, list[Rollout]] = {c.id: [] for c in candidates}
        for rollout in finished:
            by_candidate[str(rollout.metadata["apo_candidate"])].append(rollout)
        out: dict[str, Evaluation] = {}
        for cand in candidates:
            ev = await self._score(svc.store, cand.id, by_candidate[cand.id])
            if mode == "train":
                cand.scores[round_] = ev.score
                cand.worst = ev.worst
            out[cand.id] = ev
        return out

    async def _score(self, store: LightningStore, cid: str, rollouts: list[Rollout]) -> Evaluation:
        cfg = self.config
        rewards: list[float] = []
        ranked: list[tuple[float, Rollout, float | None]] = []  # (rank score, rollout, reward) for critiques
        failed = 0
        for rollout in rollouts:
            reward = None
            if rollout.status is RolloutStatus.SUCCEEDED:
                reward = rollout.final_reward
                if reward is None:
                    reward = final_reward(rollout, await _last_attempt_spans(store, rollout))
            if reward is None:
                failed += 1
                ranked.append((-math.inf, rollout, None))
            else:
                rewards.append(reward)
                if reward < cfg.failure_threshold:
                    ranked.append((reward, rollout, reward))
        counted = rewards + ([cfg.failed_reward] * failed if cfg.failed_reward is not None else [])
        score = statistics.fmean(counted) if counted else math.nan
        ranked.sort(key=lambda x: x[0])
        worst = [(rollout, reward) for _, rollout, reward in ranked[: cfg.failures_per_critique]]
        return Evaluation(cid, score, rewards, failed, worst, [r.id for r in rollouts])

    async def transcripts(self, store: LightningStore, cand: Candidate) -> list[str]:
        """The candidate's worst rollouts of its latest evaluation, rendered from their spans for the optimiser."""
        limit = self.config.transcript_chars

        async def one(rollout: Rollout, reward: float | None) -> str:
            spans = await _last_attempt_spans(store, rollout)
            return render_rollout(rollout, spans, reward=reward, text_limit=max(100, limit // 3))[:limit]

        return list(await asyncio.gather(*(one(r, w) for r, w in cand.worst)))

    # --- helpers ------------------------------------------------------------------------------
    def _optimizer(self, svc: APOServices) -> OptimizerClient:
        cfg = self.config
        return OptimizerClient(
            cfg.optimizer_base_url or f"{svc.gateway_url}/v1",
            cfg.optimizer_model or svc.model_name,
            api_key=cfg.resolved_api_key(),
            temperature=cfg.optimizer_temperature,
            max_tokens=cfg.optimizer_max_tokens,
        )

    def _llm(self, svc: APOServices) -> LLMResource:
        sampling = {"temperature": self.config.temperature, "max_tokens": self.config.max_tokens}
        return LLMResource(base_url=svc.gateway_url, model=svc.model_name, sampling=sampling)

    def _batch(self, rng: random.Random, tasks: list[Task]) -> list[Task]:
        return rng.sample(tasks, min(self.config.tasks_per_eval, len(tasks)))

    async def _validate(self, svc: APOServices, cand: Candidate, tasks: list[Task], step: int, metrics: Any) -> float:
        [ev] = (await self.evaluate(svc, [cand], tasks, round_=step, mode="val")).values()
        metrics.log(
            {
                "step": float(step),
                "val/reward_mean": ev.score,
                "val/failed_rollouts": float(ev.failed),
                "val/candidate_version": float(cand.version),
            }
        )
        self._say(f"held-out reward of {cand.id} (round {step}): {ev.score:.3f} over {len(tasks)} tasks")
        return ev.score

    def _round_row(
        self,
        round_: int,
        evals: list[Evaluation],
        beam: list[Candidate],
        new: int,
        rejected: int,
        errors: int,
        eval_s: float,
        opt_s: float,
    ) -> dict[str, float]:
        scores = [e.score for e in evals if not math.isnan(e.score)]
        return {
            "step": float(round_),
            "train/reward_mean": beam[0].scores.get(round_, math.nan),
            "apo/score_mean": statistics.fmean(scores) if scores else math.nan,
            "apo/score_min": min(scores) if scores else math.nan,
            "apo/n_candidates": float(len(evals)),
            "apo/new_candidates": float(new),
            "apo/rejected_edits": float(rejected),
            "apo/optimizer_errors": float(errors),
            "apo/failed_rollouts": float(sum(e.failed for e in evals)),
            "apo/best_version": float(beam[0].version),
            "apo/eval_s": eval_s,
            "apo/optimize_s": opt_s,
        }

    async def _publish_state(self, svc: APOServices, round_: int, beam: list[Candidate], **extra: Any) -> Resources:
        """The best prompt so far as the latest resources, with every candidate's score history."""
        best = beam[0]
        state = {
            "run_id": self._run_id,
            "round": round_,
            "best": best.id,
            "best_version": best.version,
            "beam": [c.id for c in beam],
            "candidates": [c.record() for c in self._candidates],
            **{k: v for k, v in extra.items() if v is not None},
        }
        return await svc.store.add_resources(
            llm=self._llm(svc), prompts={self.config.prompt_name: best.template}, extra={"apo": state}
        )

    def _say(self, text: str) -> None:
        log.info("%s", text)
        if self.config.progress:
            print(f"[apo] {text}", flush=True)


def _rank_score(score: float) -> float:
    return -math.inf if math.isnan(score) else score


async def _last_attempt_spans(store: LightningStore, rollout: Rollout) -> list[Any]:
    attempts = await store.query_attempts(rollout.id)
    if not attempts:
        return []
    return list(await store.query_spans(attempt_id=attempts[-1].id))
