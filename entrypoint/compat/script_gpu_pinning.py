"""Make a script's own GPU pinning harmless, since distrain pinned the GPUs already.

The guides pin by hand: `gpus = tf.config.list_physical_devices('GPU'); tf.config.set_visible_devices(
gpus[int(os.environ['SLURM_LOCALID'])], 'GPU'); tf.config.experimental.set_memory_growth(gpu, True)`. Under
distrain's MWM each task already sees only its own GPUs (CUDA_VISIBLE_DEVICES narrowed by the Plan), so
`gpus[local_rank]` is out of range on every local rank but 0; and TensorFlow was initialised before the script ran,
so a `set_visible_devices` or `set_memory_growth` that differs from what distrain set raises "... cannot be
modified after being initialized" (an identical call is a no-op in TensorFlow).

- The GPU list the script gets answers an out-of-range index equal to the task's local rank with the task's first
  GPU: the one the script meant.
- A `set_visible_devices` / `set_memory_growth` that agrees with the Plan goes through (TensorFlow's no-op); one
  that disagrees is skipped with one warning naming both choices.

This is not an upstream defect but the meeting of two pinnings; it applies only where the Plan pinned GPUs.
"""

from __future__ import annotations

from typing import Any

from ..log import get as log


class TaskGPUs(list):
    """The GPUs TensorFlow lists for this task; `[local_rank]` past the end means the task's first GPU."""

    def __init__(self, devices: list, local_rank: int) -> None:
        super().__init__(devices)
        self._local_rank = local_rank

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, int) and index == self._local_rank and index >= len(self) > 0:
            return super().__getitem__(0)
        return super().__getitem__(index)


def _names(devices: Any) -> list[str]:
    if devices is None:
        return []
    if not isinstance(devices, (list, tuple)):
        devices = [devices]
    return sorted(getattr(d, "name", str(d)) for d in devices)


def install(tf: Any, local_rank: int) -> None:
    """Wrap tf.config's listing and pinning calls (both the stable and the `experimental` names)."""
    config, experimental = tf.config, tf.config.experimental
    if getattr(config.list_physical_devices, "_distrain_task_gpus", False):
        return
    list_original = config.list_physical_devices
    visible_original = config.set_visible_devices
    growth_original = experimental.set_memory_growth
    warned: set[str] = set()

    def warn_once(what: str, line: str) -> None:
        if what not in warned:
            warned.add(what)
            log().warning(line)

    def list_physical_devices(device_type: Any = None) -> Any:
        devices = list_original(device_type)
        return TaskGPUs(devices, local_rank) if device_type == "GPU" else devices

    def set_visible_devices(devices: Any, device_type: Any = None) -> None:
        if device_type not in (None, "GPU"):
            return visible_original(devices, device_type)
        current = config.get_visible_devices("GPU")
        wanted = [d for d in (devices if isinstance(devices, (list, tuple)) else [devices])
                  if getattr(d, "device_type", "GPU") == "GPU"]
        if _names(wanted) == _names(current):
            return visible_original(devices, device_type)
        warn_once("visible", f"the script pins GPU(s) {_names(wanted)} but distrain gave this task "
                             f"{_names(current)}: keeping distrain's")
        return None

    def set_memory_growth(device: Any, enable: bool) -> None:
        try:
            return growth_original(device, enable)  # the same setting again: TensorFlow's no-op
        except RuntimeError:  # TensorFlow is initialised and the setting differs: it cannot change any more
            warn_once("growth", f"the script sets memory growth {enable} on {_names(device)} after TensorFlow "
                                f"started (distrain set {not enable}): keeping distrain's")
            return None

    # patch: script_gpu_pinning.device_calls
    list_physical_devices._distrain_task_gpus = True
    for namespace in (config, experimental):
        for name, replacement in (("list_physical_devices", list_physical_devices),
                                  ("set_visible_devices", set_visible_devices)):
            if hasattr(namespace, name):
                setattr(namespace, name, replacement)
    experimental.set_memory_growth = set_memory_growth
