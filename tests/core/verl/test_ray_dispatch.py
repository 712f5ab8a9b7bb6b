"""VeRL's data path across a real Ray boundary (local Ray instance, CPU only).

VeRL's ``RayWorkerGroup`` ships the no-padding ``TensorDict`` (nested jagged tensors plus
non-tensor metadata) to remote workers and back. Here the fake actor worker group runs inside a
real Ray actor, and ``VerlBackend`` drives it through a thin proxy that forwards each call with
``ray.get(handle.method.remote(...))``; the loss must equal the in-process one. Starting Ray
takes ~20 s on a small machine, hence ``slow``.
"""

from __future__ import annotations

import sys
from typing import Any

import pytest

pytest.importorskip("verl")
ray = pytest.importorskip("ray")

from lightning_rl.backends.verl import VerlBackend, VerlBackendConfig, VerlWorkers  # noqa: E402
from lightning_rl.credit import compute_advantages  # noqa: E402


class RayForwardingWorkerGroup:
    """Forwards every worker-group call to a Ray actor, as VeRL's RayWorkerGroup does (one rank)."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.handle, name)
        return lambda *args, **kwargs: ray.get(method.remote(*args, **kwargs))


@pytest.mark.slow
def test_update_through_a_ray_actor_equals_in_process(recorded_run: Any, samples: list[Any], fake_actor: Any) -> None:
    import copy

    transitions = compute_advantages(samples, strategy="broadcast", estimator="grpo")
    config = VerlBackendConfig(pad_token_id=recorded_run.pad_token_id)
    local = fake_actor()
    local_metrics = VerlBackend(VerlWorkers(actor=local, dp_size=1), config).update(copy.deepcopy(transitions))

    fake_cls = type(local)
    # Ray workers cannot import the conftest module by name: ship the fake class by value
    module = sys.modules[fake_cls.__module__]
    ray.cloudpickle.register_pickle_by_value(module)
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        handle = ray.remote(fake_cls).remote(recorded_run.model_path)
        remote = RayForwardingWorkerGroup(handle)
        metrics = VerlBackend(VerlWorkers(actor=remote, dp_size=1), config).update(transitions)
        remote_losses = ray.get(handle.__ray_call__.remote(lambda self: self.losses))
    finally:
        ray.shutdown()
        ray.cloudpickle.unregister_pickle_by_value(module)
    assert metrics["train/loss"] == pytest.approx(local_metrics["train/loss"], abs=1e-6)
    assert remote_losses == pytest.approx(local.losses, abs=1e-6)
