"""Trainer settings: one documented dataclass, embedded defaults that train a tiny agent on a CPU."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
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
    adapters: Literal["shared", "per_role"] = "shared"
    """What the trainable roles train. ``shared``: one set of weights for every role (all of them, or
    LoRA with ``backend.lora_rank``). ``per_role``: each trainable role trains its own LoRA adapter
    (rank, alpha and targets from ``backend.lora_*``; ``lora_rank`` must be > 0) over one frozen base
    model, with its own optimiser; the engine serves each call with its role's adapter, all roles in
    one batch, and every other call (untrainable roles, calls of no role) with the base weights, so
    ``untrainable_roles`` does not apply. One copy of the base is kept, shared by the engine and the
    trainer. Policy gradient only (``update_rule="policy_gradient"``). See docs/adapters.md."""
    sequence: Literal["per_call", "concatenated"] = "per_call"
    """What one training sample is. ``per_call`` (LightningRL): every model call is its own transition,
    with the prompt it was sent. ``concatenated``: a rollout's calls are spliced into one sequence with
    the loss masked to the policy's own tokens (``lightning_rl.sequences``), the usual way of training a
    multi-turn agent, kept for comparison (``benchmarks/beyond_imitation.py``). Policy gradient only."""
    time_budget_s: float | None = None
    """Training time, in seconds, a run may spend (``steps`` stays the most): the time of the steps
    themselves (rollouts, update, publish), without validation, so that runs compared at one budget
    spend it on training alone. A step starts only if, taking as long as the step before it, it would
    end within the budget (the first step always runs). None: run every step."""
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
    precision: str = "float32"
    """Number format of the engine and of the policy's frozen weights: ``float32``, ``bfloat16``, or
    ``auto`` (``bfloat16`` where it runs faster: a GPU, or a CPU with AVX512_BF16 or AMX whose
    bfloat16 matmul measures at least 1.25x float32's, see ``fast_bfloat16``; else ``float32``: an
    AVX2 CPU emulates bfloat16 ~60x slower, and some AVX512_BF16 CPUs run it slower too). In
    ``bfloat16`` the engine serves bfloat16 weights and its KV cache is bfloat16; the backend keeps a
    LoRA base in bfloat16 (``TorchBackendConfig.dtype``) or, when every weight trains, runs the body
    under autocast with float32 weights; and the PPO ratio is taken against the backend's own
    recomputed logprobs (``old_logprobs="recompute"``), because the engine's differ from them by
    rounding. SmolLM2-135M on one AMX core: docs/models.md."""
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
        if self.adapters not in ("shared", "per_role"):
            raise ValueError(f"TrainerConfig.adapters must be 'shared' or 'per_role', got {self.adapters!r}.")
        if self.adapters == "per_role":
            if self.backend.lora_rank <= 0:
                raise ValueError(
                    "adapters='per_role' trains one LoRA adapter per role: set backend.lora_rank > 0 "
                    "(in a run file, [algorithm.backend] lora_rank = 8)."
                )
            if self.update_rule != "policy_gradient":
                raise ValueError(
                    f"adapters='per_role' trains with update_rule='policy_gradient' only, got {self.update_rule!r}."
                )
        if self.sequence not in ("per_call", "concatenated"):
            raise ValueError(f"TrainerConfig.sequence must be 'per_call' or 'concatenated', got {self.sequence!r}.")
        if self.sequence == "concatenated" and (self.update_rule != "policy_gradient" or self.adapters != "shared"):
            raise ValueError(
                "sequence='concatenated' trains with update_rule='policy_gradient' and shared adapters only, got "
                f"update_rule={self.update_rule!r}, adapters={self.adapters!r}."
            )
        if self.time_budget_s is not None and self.time_budget_s <= 0:
            raise ValueError(f"TrainerConfig.time_budget_s must be > 0 or None, got {self.time_budget_s}.")
        if self.temperature <= 0:
            raise ValueError("training needs temperature > 0 (greedy sampling has no policy gradient).")
        self._resolve_precision()

    def _resolve_precision(self) -> None:
        """Turn ``precision`` into the engine's and the backend's settings (see ``precision``)."""
        from lightning_rl.backends.torch_backend import fast_bfloat16

        if self.precision not in ("float32", "bfloat16", "auto"):
            raise ValueError(
                f"TrainerConfig.precision must be 'float32', 'bfloat16' or 'auto', got {self.precision!r}."
            )
        if self.precision == "auto":
            self.precision = "bfloat16" if fast_bfloat16(self.device) else "float32"
        if self.precision == "bfloat16":
            body: dict[str, Any] = {"old_logprobs": "recompute"}
            if self.backend.lora_rank > 0:
                body["dtype"] = "bfloat16"
            elif self.backend.autocast is None:
                body["autocast"] = "bfloat16"
            self.backend = replace(self.backend, **body)
