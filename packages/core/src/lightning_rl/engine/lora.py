"""Several LoRA adapters over one set of base weights, chosen per row of a batch.

Per-role training (``TrainerConfig.adapters = "per_role"``) gives every trainable role of a
multi-agent app its own LoRA adapter over one shared base model. The rollouts of one step mix the
roles' calls, and serving each role from its own engine (or merging each adapter into its own copy
of the weights) would cost one copy of the model per role and one forward pass per role per step.
Instead ``AdapterBank.install`` replaces each targeted ``nn.Linear`` of the served model with a
``MultiLoRALinear``: the base projection runs once for the whole batch, and each row then adds the
low-rank delta ``scale * (x @ A_i^T) @ B_i^T`` of its own adapter ``i``, computed over the rows of
that adapter together (``index_add_``, no per-row loop). A row of no adapter (slot ``-1``: a frozen
role, or a call no trainable role made) adds nothing, so its numbers are the base model's exactly.

Which adapter each row uses is set by the engine around each forward pass: ``bank.rows(slots)`` for
a decode step over rows of different adapters, ``bank.uniform(slot)`` for a prefill of one adapter's
prompts (the engine prefills each adapter's admitted prompts apart, since a shared prompt prefix has
different keys and values under different adapters).

Adapters arrive as PEFT state dicts (``get_peft_model_state_dict``: keys
``base_model.model.<module>.lora_A.weight`` ``[r, in]`` and ``...lora_B.weight`` ``[out, r]``), the
format the trainer saves and ``peft.PeftModel.from_pretrained`` loads, so what the engine serves is
byte for byte what is exported. Each adapter carries a version: how many times it was loaded.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import nn

__all__ = ["AdapterBank", "AdapterWeights", "MultiLoRALinear", "peft_module_name"]

_PREFIX = "base_model.model."


def peft_module_name(key: str) -> tuple[str, str] | None:
    """``(module, "A" | "B")`` of a PEFT adapter state-dict key, or None for another key."""
    for part, which in ((".lora_A.weight", "A"), (".lora_B.weight", "B")):
        if key.endswith(part):
            module = key[: -len(part)]
            return (module.removeprefix(_PREFIX), which)
    return None


@dataclass(frozen=True)
class AdapterWeights:
    """One adapter to load: its PEFT state dict and its scale (``lora_alpha / r``)."""

    state_dict: Mapping[str, torch.Tensor]
    scale: float
    version: int | None = None
    """The adapter's version from now on; None: one more than before (1 for a new adapter). The
    trainer passes its own count, so that a resumed run's engine reports the versions it had."""


class _Routing(threading.local):
    """Which adapter each row of the running forward pass uses (the engine's worker thread sets it)."""

    rows: torch.Tensor | int | None = None


class MultiLoRALinear(nn.Linear):
    """The base linear layer plus, per row of ``x``, the delta of that row's adapter (see the module
    docstring).

    It takes over the wrapped layer's ``weight`` and ``bias`` under the same names, so the model's
    state-dict keys do not change (a full weight load still finds every key). ``lora_a`` ``[n, r, in]``
    and ``lora_b`` ``[n, out, r]`` hold every adapter's factors, slot ``i`` of each being adapter
    ``i``; they are plain tensors, not parameters or buffers: the engine never trains them and they
    stay out of the state dict.
    """

    def __init__(self, base: nn.Linear, routing: _Routing) -> None:
        nn.Module.__init__(self)
        self.in_features = base.in_features
        self.out_features = base.out_features
        self.weight = base.weight
        self.bias = base.bias
        self._routing = routing
        self.lora_a: torch.Tensor | None = None
        self.lora_b: torch.Tensor | None = None
        self.scales: list[float] = []

    def forward(self, input: torch.Tensor) -> torch.Tensor:  # the parameter name of nn.Linear.forward
        x = input
        y = nn.functional.linear(x, self.weight, self.bias)
        rows = self._routing.rows
        if rows is None or self.lora_a is None or self.lora_b is None:
            return y
        if isinstance(rows, int):
            if rows < 0 or rows >= self.lora_a.shape[0]:
                return y
            return y + self._delta(x, rows)
        for slot in torch.unique(rows).tolist():
            if slot < 0 or slot >= self.lora_a.shape[0]:
                continue
            index = (rows == slot).nonzero().squeeze(-1)
            y = y.index_add(0, index, self._delta(x.index_select(0, index), int(slot)))
        return y

    def _delta(self, x: torch.Tensor, slot: int) -> torch.Tensor:
        assert self.lora_a is not None and self.lora_b is not None
        a, b = self.lora_a[slot], self.lora_b[slot]
        return (x.to(a.dtype) @ a.T @ b.T * self.scales[slot]).to(x.dtype)


class AdapterBank:
    """The adapters an engine serves, by name, over the model's own base weights.

    ``install`` wraps the modules whose names end with one of ``targets`` (PEFT's
    ``target_modules`` matching); ``load`` adds or replaces adapters; ``slot(name)`` is the index a
    row passes to ``rows``/``uniform``. Only the engine's worker thread loads adapters and runs
    forward passes, so no lock is needed; ``names``, ``version_of`` may be read from any thread.
    """

    def __init__(self) -> None:
        self._routing = _Routing()
        self._modules: dict[str, MultiLoRALinear] = {}
        self._slots: dict[str, int] = {}
        self._versions: dict[str, int] = {}

    @classmethod
    def install(cls, model: nn.Module, targets: Sequence[str]) -> AdapterBank:
        """Wrap ``model``'s linear layers named ``*.<target>`` (in place); returns the bank."""
        bank = cls()
        wanted = tuple(targets)
        for name, module in list(model.named_modules()):
            if not isinstance(module, nn.Linear) or name.split(".")[-1] not in wanted:
                continue
            parent_name, _, child = name.rpartition(".")
            parent = model.get_submodule(parent_name) if parent_name else model
            wrapped = MultiLoRALinear(module, bank._routing)
            setattr(parent, child, wrapped)
            bank._modules[name] = wrapped
        if not bank._modules:
            raise ValueError(
                f"no linear layer of the model is named like {list(targets)}; set lora_targets to its names."
            )
        return bank

    @property
    def names(self) -> list[str]:
        """The adapters loaded so far, in slot order."""
        return list(self._slots)

    def slot(self, name: str | None) -> int:
        """The slot of adapter ``name``; ``-1`` for None (the base weights)."""
        if name is None:
            return -1
        if name not in self._slots:
            raise KeyError(f"no adapter {name!r} is loaded; loaded: {self.names}")
        return self._slots[name]

    def version_of(self, name: str | None) -> int | None:
        """How many times adapter ``name`` was loaded (None for the base weights)."""
        return None if name is None else self._versions.get(name)

    def load(self, adapters: Mapping[str, AdapterWeights]) -> None:
        """Add or replace the named adapters (between forward passes) at their new versions."""
        for name, weights in adapters.items():
            factors: dict[str, dict[str, torch.Tensor]] = {}
            for key, value in weights.state_dict.items():
                parsed = peft_module_name(key)
                if parsed is None:
                    raise ValueError(
                        f"adapter {name!r}: {key!r} is no LoRA factor (expected PEFT's lora_A/lora_B keys)."
                    )
                module, which = parsed
                if module not in self._modules:
                    raise ValueError(f"adapter {name!r}: {module!r} is not a LoRA target of the served model.")
                factors.setdefault(module, {})[which] = value
            slot = self._slots.setdefault(name, len(self._slots))
            for module_name, module in self._modules.items():
                pair = factors.get(module_name)
                if pair is None or set(pair) != {"A", "B"}:
                    # a target the adapter does not cover adds nothing: zero factors of rank 1
                    pair = {
                        "A": torch.zeros(1, module.in_features),
                        "B": torch.zeros(module.out_features, 1),
                    }
                _set_slot(module, slot, pair["A"], pair["B"], weights.scale)
            self._versions[name] = weights.version if weights.version is not None else self._versions.get(name, 0) + 1

    @contextlib.contextmanager
    def rows(self, slots: Sequence[int]) -> Generator[None]:
        """Forward passes inside run row ``i`` with adapter slot ``slots[i]`` (``-1``: the base)."""
        first = next(iter(self._modules.values()))
        device = first.weight.device
        previous = self._routing.rows
        if all(s < 0 for s in slots):
            self._routing.rows = None
        elif len(set(slots)) == 1:
            self._routing.rows = int(slots[0])
        else:
            self._routing.rows = torch.tensor(list(slots), dtype=torch.long, device=device)
        try:
            yield
        finally:
            self._routing.rows = previous

    def uniform(self, slot: int) -> contextlib.AbstractContextManager[None]:
        """Forward passes inside run every row (whatever the batch size) with adapter ``slot``."""
        return self.rows([slot])


def _set_slot(module: MultiLoRALinear, slot: int, a: torch.Tensor, b: torch.Tensor, scale: float) -> None:
    """Write one adapter's factors into ``slot`` of ``module``, growing the stacks (and the rank) as needed."""
    weight = module.weight
    a = a.to(device=weight.device, dtype=weight.dtype)
    b = b.to(device=weight.device, dtype=weight.dtype)
    rank = a.shape[0]
    if tuple(a.shape) != (rank, module.in_features) or tuple(b.shape) != (module.out_features, rank):
        raise ValueError(
            f"LoRA factors of shape {tuple(a.shape)} and {tuple(b.shape)} do not fit a "
            f"{module.in_features} -> {module.out_features} layer."
        )
    stack_a, stack_b = module.lora_a, module.lora_b
    n = max(slot + 1, 0 if stack_a is None else stack_a.shape[0])
    width = max(rank, 0 if stack_a is None else stack_a.shape[1])
    if stack_a is None or stack_b is None or stack_a.shape[0] < n or stack_a.shape[1] < width:
        # zero padding of the rank adds exact zeros to the product: a smaller adapter is unchanged
        new_a = weight.new_zeros((n, width, module.in_features))
        new_b = weight.new_zeros((n, module.out_features, width))
        if stack_a is not None and stack_b is not None:
            new_a[: stack_a.shape[0], : stack_a.shape[1]] = stack_a
            new_b[: stack_b.shape[0], :, : stack_b.shape[2]] = stack_b
        stack_a, stack_b = new_a, new_b
    stack_a[slot].zero_()
    stack_b[slot].zero_()
    stack_a[slot, :rank] = a
    stack_b[slot, :, :rank] = b
    module.lora_a, module.lora_b = stack_a, stack_b
    module.scales = [*module.scales, *([0.0] * (n - len(module.scales)))]
    module.scales[slot] = scale
