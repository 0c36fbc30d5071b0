"""GPU visibility and memory: applied around the TensorFlow import, as the Plan says."""

from __future__ import annotations

import contextlib

from .errors import EnvironmentProblem
from .plan import Plan

NO_GPU_HINT = (
    "no GPU is visible but this image requires one (DISTRAIN_REQUIRE_GPU=1): run with `apptainer run --nv`, "
    "`docker run --gpus all`, or ask Slurm for GPUs (--gres=gpu:N / --gpus-per-task=1); "
    "set DISTRAIN_REQUIRE_GPU=0 to train on the CPU"
)


def check_required_before_import(plan: Plan) -> None:
    """Fail before the (slow) TensorFlow import when the GPU check can already be decided."""
    if plan.require_gpu and not plan.gpus_visible:
        raise EnvironmentProblem(NO_GPU_HINT)


def configure(plan: Plan, tf) -> list:  # noqa: ANN001 - the tensorflow module
    """Turn on memory growth for the GPUs TensorFlow sees; enforce DISTRAIN_REQUIRE_GPU. Returns them."""
    gpus = tf.config.list_physical_devices("GPU")
    if plan.require_gpu and not gpus:
        raise EnvironmentProblem(
            NO_GPU_HINT.replace("no GPU is visible", "TensorFlow sees no GPU (device files present, driver not)")
        )
    if plan.devices and not gpus:
        from .log import get

        get().warning(f"the plan pins GPU {','.join(plan.devices)} but TensorFlow sees no GPU: training on the CPU")
    for gpu in gpus:
        with contextlib.suppress(RuntimeError):  # already initialised by the user's own code: leave it
            tf.config.experimental.set_memory_growth(gpu, True)
    return gpus
