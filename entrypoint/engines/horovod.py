"""Horovod: init, check the ranks against the Plan, pin the GPU by hvd.local_rank()."""

from __future__ import annotations

import importlib
import importlib.util

from ..errors import ConfigError, EnvironmentProblem
from ..plan import Plan

MISSING = (
    "Horovod is not installed here but DISTRAIN_MODE=horovod: use the distrain image, build it into this "
    "environment with scripts/build-horovod.sh, or use DISTRAIN_MODE=mwm"
)


def check_installed() -> None:
    """Fail before the TensorFlow import when Horovod cannot be there."""
    if importlib.util.find_spec("horovod") is None:
        raise EnvironmentProblem(MISSING)


def init(plan: Plan, tf):  # noqa: ANN001, ANN201 - tensorflow module in, horovod module out
    """hvd.init() and pin one GPU per process. The Keras alias (setup) must be in place first."""
    try:  # Horovod's Keras API drives tf_keras only; Keras 3 goes through horovod.tensorflow (compat.keras3_horovod)
        hvd = importlib.import_module("horovod.tensorflow.keras" if plan.family.horovod_keras_api
                                      else "horovod.tensorflow")
    except ImportError as exc:  # installed but broken (built against another TensorFlow, MPI missing)
        raise EnvironmentProblem(f"Horovod does not load ({exc}); rebuild it with scripts/build-horovod.sh") from None
    hvd.init()
    if (hvd.rank(), hvd.size()) != (plan.rank, plan.size):
        raise ConfigError(
            f"Horovod reports rank {hvd.rank()} of {hvd.size()} but the launcher's variables said "
            f"{plan.rank} of {plan.size}: launch with one launcher (srun --mpi=pmix, mpirun or horovodrun)"
        )
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        # Horovod's documented pinning: by hvd.local_rank(); a CUDA_VISIBLE_DEVICES narrowed to one GPU per task
        # (srun --gpus-per-task=1) leaves exactly one, which is then the one to use.
        gpu = gpus[0] if len(gpus) == 1 else gpus[hvd.local_rank()]
        tf.config.set_visible_devices(gpu, "GPU")
    return hvd


def liveness_addresses(hvd) -> tuple[str, ...]:  # noqa: ANN001 - the horovod module
    """Open a listening port on every rank and share the addresses, so a survivor can tell which rank died.

    Horovod's errors for a lost peer (Gloo: "Connection closed by peer [ip]:port", MPI: aborted) do not say
    which rank it was. The socket is never accepted from or read: the kernel completes a connection to it while
    the process lives and refuses one after it died. (One port per rank: see README, Security.)
    """
    import socket

    from horovod.tensorflow import allgather_object

    if hvd.size() < 2:
        return ()
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("", 0))
    listener.listen(64)
    _KEEP.append(listener)
    mine = f"{socket.gethostname()}:{listener.getsockname()[1]}"
    return tuple(allgather_object(mine, name="distrain_liveness"))


_KEEP: list = []  # the listening sockets live as long as the process
