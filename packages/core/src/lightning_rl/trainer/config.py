"""Trainer settings: one documented dataclass, embedded defaults that train a tiny agent on a CPU."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from lightning_rl.adapter import AIRPolicy
from lightning_rl.backends.torch_backend import TorchBackendConfig
from lightning_rl.credit import AdvantageEstimator, CreditStrategy
from lightning_rl.rewards.config import JudgeConfig
from lightning_rl.trainer.sinks import LOGGERS, check_loggers

__all__ = ["TrainerConfig"]


@dataclass
class TrainerConfig:
    """Everything the LightningRL loop needs besides the agent and the tasks."""

    model: str = "tiny"
    """An HF model folder or hub name, or ``tiny`` for the locally built tiny model."""
    run_dir: str = "runs/latest"
    """Where the store, metrics, reward curve and checkpoints go."""
    store: str | None = None
    """The store's URL or path (``postgresql://...``, ``sqlite:///path``, a SQLite file; see
    ``lightning_rl.store.open_store``). None: ``<run_dir>/store.sqlite``. Embedded services only."""
    store_retry_s: float = 120.0
    """With a store server (``store = "http://..."``): how long a failing store call is retried
    before the run gives up, so a restart of the server or of its database does not end the run
    (benchmarks/chaos.py restarts both under training)."""
    steps: int = 20
    """Policy updates to run."""
    batch_size: int = 16
    """Tasks per step; each runs ``group_size`` times."""
    group_size: int = 8
    """Rollouts per task, compared with each other by GRPO/RLOO."""
    temperature: float = 1.0
    """Sampling temperature of training rollouts (logprobs are computed under the same distribution)."""
    top_p: float = 1.0
    max_tokens: int = 64
    """Most tokens per LLM call."""
    val_temperature: float | None = None
    """Sampling temperature of validation rollouts (None: same as training)."""
    val_every: int = 5
    """Validate every this many steps (0: only before and after training)."""
    credit: CreditStrategy = "broadcast"
    """How the final reward is spread over a rollout's calls: broadcast, discounted or last."""
    gamma: float = 1.0
    """Discount of the ``discounted`` strategy."""
    estimator: AdvantageEstimator = "grpo"
    """Rollout-level advantage: grpo, grpo_no_std or rloo."""
    air: AIRPolicy = field(default_factory=dict[str, float])
    """Automatic intermediate rewards: signal name -> reward per occurrence, e.g. {"tool_error": -0.1}
    (see ``lightning_rl.adapter.air_policy``)."""
    judge: JudgeConfig | None = None
    """A group-relative LLM judge whose scores become the rewards (``lightning_rl.rewards``,
    docs/rewards.md); in a run file, an ``[algorithm.judge]`` table. None: the agent's own reward."""
    untrainable_roles: Literal["shared", "frozen"] = "shared"
    """What answers the roles that are not trained. ``shared``: the policy under training (one set of
    weights, so as the trainable roles learn, what the other roles say changes too). ``frozen``: a
    second copy of the starting weights that no update reaches (one more copy of the model in memory;
    their calls keep recording weights version 0). Which roles are untrainable: ``Trainer(trainable=...)``
    when given, else the plugins' ``instrument(trainable=...)`` in this process."""
    skip_zero_advantage: bool = True
    """Leave transitions with zero advantage out of the update (no gradient without a KL term)."""
    update_rule: str = "policy_gradient"
    """How each step's scored rollouts update the weights (``lightning_rl.trainer.update_rules``):
    ``policy_gradient`` (GRPO/RLOO/PPO-clip), ``sft`` (needs ``SFTConfig``), ``dpo`` (needs ``DPOConfig``),
    or a registered rule."""
    rollout_timeout_s: float = 120.0
    """Limit of one attempt, enforced by the store."""
    heartbeat_timeout_s: float = 60.0
    max_attempts: int = 1
    """Attempts per rollout (lost workers and timeouts are retried while attempts remain)."""
    step_timeout_s: float = 900.0
    """How long to wait for a step's rollouts; stragglers are cancelled and counted."""
    concurrency: int = 64
    """Rollouts the in-process runner runs at once. 0: no in-process runner; rollouts are run by
    ``lightning-rl runner --store <run_dir>/store.sqlite --agent module:fn`` processes you start
    (on this machine; the trainer prints the command)."""
    engine_batch_size: int = 64
    """Most sequences the embedded engine decodes together when runners are external (else ``concurrency``)."""
    checkpoint_every: int = 0
    """Save a checkpoint every this many steps (0: only at the end)."""
    resume: bool = False
    """Continue from the latest checkpoint in ``run_dir``."""
    seed: int = 0
    """Seeds the task order, the backend and every recorded call's sampling (``lightning_rl.seeding``)."""
    deterministic: bool = False
    """Make two runs of one seed, on one machine and thread count, log identical metrics apart from
    timings. Sampling seeds repeat in both modes; what differs between runs by default is float
    rounding that depends on which requests the engine happens to batch together (batch shape,
    padding, the shared prefix). This mode has the engine serve one sequence at a time, so that every
    call's logits depend on its own tokens only (each step's rollouts reach the update in the order
    they were enqueued in both modes). It is slower: rollouts run one decode stream instead of a
    batch (docs/learning.md says how much)."""
    device: str = "cpu"
    backend: TorchBackendConfig = field(default_factory=TorchBackendConfig)
    tensorboard: bool = True
    """With ``loggers=None``: mirror metrics to TensorBoard when it is installed (skipped silently if not)."""
    loggers: list[str] | None = None
    """Metric sinks besides metrics.jsonl, each an extra: any of "tensorboard", "wandb", "mlflow"
    (``pip install 'lightning-rl[wandb]'`` ...). Same keys and steps as metrics.jsonl. Checked when
    the config is built: an unknown name or a missing extra raises at once. None: see ``tensorboard``."""
    logger_options: dict[str, dict[str, Any]] = field(default_factory=dict[str, dict[str, Any]])
    """Per-sink settings, e.g. ``{"wandb": {"project": "calc", "mode": "offline"}}`` (``wandb.init``
    arguments) or ``{"mlflow": {"tracking_uri": ..., "experiment_name": ...}}`` (default: SQLite in
    ``<run_dir>/mlflow.db`` unless ``MLFLOW_TRACKING_URI`` is set). See ``lightning_rl.trainer.sinks``."""
    progress: bool = True
    """Show a progress bar and one line per step on the terminal (rich)."""

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "group_size", "engine_batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"TrainerConfig.{name} must be >= 1, got {getattr(self, name)}.")
        if self.concurrency < 0:
            raise ValueError(f"TrainerConfig.concurrency must be >= 0 (0: external runners), got {self.concurrency}.")
        if self.val_every < 0 or self.checkpoint_every < 0:
            raise ValueError("val_every and checkpoint_every must be >= 0.")
        if self.loggers is not None:
            self.loggers = list(check_loggers(self.loggers))
        unknown = set(self.logger_options) - set(LOGGERS)
        if unknown:
            raise ValueError(f"logger_options names unknown loggers {sorted(unknown)}; known: {', '.join(LOGGERS)}.")
        from lightning_rl.trainer.update_rules import update_rule_names

        if self.update_rule not in update_rule_names():
            raise ValueError(
                f"TrainerConfig.update_rule {self.update_rule!r} is unknown; known: {', '.join(update_rule_names())}."
            )
        if self.untrainable_roles not in ("shared", "frozen"):
            raise ValueError(
                f"TrainerConfig.untrainable_roles must be 'shared' or 'frozen', got {self.untrainable_roles!r}."
            )
        if self.temperature <= 0:
            raise ValueError("training needs temperature > 0 (greedy sampling has no policy gradient).")
