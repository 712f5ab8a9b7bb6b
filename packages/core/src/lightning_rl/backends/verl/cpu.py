"""A CPU platform for VeRL, so its real FSDP actor workers run on a machine without accelerators.

VeRL 0.9.1 asks one platform object (``verl.plugin.platform.get_platform()``) for everything
device-specific: the torch device name, the collective backend, the Ray resource of a worker, the
device index. It ships CUDA, NPU and ROCm platforms and, with none available, *falls back to
CUDA* (``platform_manager._detect_platform_name``), so on a CPU-only machine its workers call
``torch.cuda`` and fail. VeRL's public extension points are enough to run them on CPU instead:

* ``PlatformRegistry.register(platform="cpu")`` adds the platform below; ``VERL_PLATFORM=cpu``
  selects it. Ray worker processes import this module through ``VERL_USE_EXTERNAL_MODULES``
  (``import verl`` imports the modules it names), so every worker registers it before use.
* ``EngineRegistry.register(..., device="cpu")`` makes VeRL's own FSDP engine classes
  (``FSDPEngineWithLMHead``; registered for ``cuda``/``npu`` only) the engines for ``cpu``.
* ``CpuActorRolloutRefWorker`` (a subclass of VeRL's worker) creates the gloo process group
  itself: VeRL's own call would ask torch for the invalid backend ``"cpu:gloo,cpu:gloo"``.

Set the two variables with ``cpu_runtime_env()`` (``ray.init(runtime_env=...)``) and in the
driver process with ``use_cpu_platform()``. Collectives use gloo (FSDP2 on a gloo device mesh).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Generator
from types import ModuleType
from typing import Any

import torch

from lightning_rl.backends.verl._require import require_verl

require_verl()

from verl.plugin.platform import PlatformBase, PlatformRegistry  # noqa: E402  # pyright: ignore[reportMissingImports]

__all__ = ["PlatformCPU", "CpuActorRolloutRefWorker", "CPU_PLATFORM_ENV", "cpu_runtime_env", "use_cpu_platform"]

CPU_PLATFORM_ENV: dict[str, str] = {
    "VERL_PLATFORM": "cpu",
    "VERL_USE_EXTERNAL_MODULES": __name__,
}
"""Environment that makes VeRL (driver and Ray workers) pick ``PlatformCPU``."""


class _HostDevice(ModuleType):
    """VeRL's ``torch.<device>`` module for the host: ``torch.cpu`` plus the memory calls it lacks.

    VeRL calls ``get_torch_device().empty_cache()``, ``.max_memory_allocated()``,
    ``.mem_get_info()``, ``.get_rng_state()`` ... unconditionally; ``torch.cpu`` has none of them.
    Host memory is not a device pool: those report 0 and the RNG calls use torch's CPU generator.
    Everything else is ``torch.cpu``'s (``synchronize``, ``Stream``, ``current_device`` ...).
    """

    def __init__(self) -> None:
        super().__init__("lightning_rl_host_device")

    def __getattr__(self, name: str) -> Any:
        return getattr(torch.cpu, name)

    def empty_cache(self) -> None:
        return None

    def ipc_collect(self) -> None:
        return None

    def memory_allocated(self, device: Any = None) -> int:
        return 0

    def memory_reserved(self, device: Any = None) -> int:
        return 0

    def max_memory_allocated(self, device: Any = None) -> int:
        return 0

    def max_memory_reserved(self, device: Any = None) -> int:
        return 0

    def reset_peak_memory_stats(self, device: Any = None) -> None:
        return None

    def mem_get_info(self, device: Any = None) -> tuple[int, int]:
        return 0, 0

    def set_per_process_memory_fraction(self, fraction: float, device: Any = None) -> None:
        return None

    def get_device_name(self, device: Any = None) -> str:
        return "cpu"

    def get_rng_state(self, device: Any = None) -> torch.Tensor:
        return torch.get_rng_state()

    def set_rng_state(self, state: torch.Tensor, device: Any = None) -> None:
        torch.set_rng_state(state)

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)


_HOST = _HostDevice()


@PlatformRegistry.register(platform="cpu")  # pyright: ignore[reportUntypedClassDecorator]
class PlatformCPU(PlatformBase):  # pyright: ignore[reportUntypedBaseClass]
    """VeRL's platform interface for host CPU: gloo collectives, Ray ``CPU`` resources, no device memory."""

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> ModuleType:
        return _HOST

    def is_available(self) -> bool:
        return True

    def current_device(self) -> Any:
        # VeRL passes this to ``tensor.to(...)`` and ``torch.device(...)``: an int would mean CUDA device 0
        return "cpu"

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        return None

    def synchronize(self, device_index: int | None = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return "CUDA_VISIBLE_DEVICES"

    @contextlib.contextmanager
    def nvtx_range(self, msg: str) -> Generator[None]:
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        return "CPU"

    def ray_resource_options(self, num_gpus: float) -> dict[str, Any]:
        # each worker holds the CPU of its placement-group bundle; nothing more to ask Ray for
        return {}

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> Any:
        return None


def _register_cpu_engines() -> None:
    """VeRL's FSDP language-model engine, registered for ``cpu`` (VeRL registers it for cuda/npu)."""
    from verl.workers.engine.base import EngineRegistry  # pyright: ignore[reportMissingImports]
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead  # pyright: ignore[reportMissingImports]

    engines: dict[str, Any] = EngineRegistry._engines  # noqa: SLF001  # pyright: ignore[reportUnknownMemberType]
    if "cpu" not in engines.get("language_model", {}).get("fsdp2", {}):
        EngineRegistry.register(model_type="language_model", backend=["fsdp", "fsdp2"], device="cpu")(  # pyright: ignore[reportUnknownMemberType]
            FSDPEngineWithLMHead
        )


def _cpu_worker_cls() -> type[Any]:
    from verl.workers.engine_workers import ActorRolloutRefWorker  # pyright: ignore[reportMissingImports]

    class CpuActorRolloutRefWorker(ActorRolloutRefWorker):  # pyright: ignore[reportUntypedBaseClass]
        """VeRL's ``ActorRolloutRefWorker`` whose process group is plain gloo.

        VeRL's ``initialize_global_process_group_ray`` (verl/utils/distributed.py) builds the backend
        string ``f"cpu:gloo,{device}:{backend}"``, which for device ``cpu`` is ``"cpu:gloo,cpu:gloo"``
        and torch rejects (duplicate device type). It skips the call when the default process group
        already exists, so this worker creates it with ``backend="gloo"`` first (same env rendezvous).
        """

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            from verl.utils.distributed import initialize_global_process_group_ray  # pyright: ignore[reportMissingImports]

            initialize_global_process_group_ray(timeout_second=None, backend="gloo")

    return CpuActorRolloutRefWorker


def cpu_runtime_env() -> dict[str, Any]:
    """``ray.init(runtime_env=...)`` for CPU workers: they import this module and select ``PlatformCPU``."""
    return {"env_vars": dict(CPU_PLATFORM_ENV)}


def use_cpu_platform() -> None:
    """Select ``PlatformCPU`` in this process (the driver) before VeRL first asks for its platform."""
    from verl.plugin.platform import (  # pyright: ignore[reportMissingImports]
        get_platform,
        platform_manager,  # pyright: ignore[reportMissingImports]
        set_platform,
    )

    os.environ.update(CPU_PLATFORM_ENV)
    current: Any = platform_manager._current_platform  # noqa: SLF001  # pyright: ignore[reportUnknownMemberType]
    if current is None or not isinstance(current, PlatformCPU):
        set_platform(PlatformCPU())
    assert get_platform().device_name == "cpu"


_register_cpu_engines()
CpuActorRolloutRefWorker: type[Any] = _cpu_worker_cls()
"""VeRL's hybrid worker for CPU (see ``_cpu_worker_cls``); pass it to ``RayClassWithInitArgs``."""
