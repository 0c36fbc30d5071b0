"""`distrain doctor`'s checks: the host (proxies, caches, containers, the driver's GPUs, /dev/shm), TensorFlow,
Horovod, and every patch of another library (compat/registry.py) for the versions installed here. Each prints its
lines and returns the problems it found."""

from __future__ import annotations

import os

import typer

from ..errors import DistrainError
from ..plan import PROXY_VARS, Plan

SECURITY_LINE = (
    "security: MWM's gRPC ports (TensorFlow binds them on every interface) and Horovod's Gloo/MPI ports have no "
    "authentication: whoever reaches this node's ports can join or disrupt a run; keep workers on a private "
    "network or behind a compute-node firewall (README: Security)"
)


def _container_tools() -> str:
    """Which container tools work here (informational: inside an image neither is expected)."""
    import shutil
    import subprocess

    parts = []
    try:
        from .images import find_apptainer

        binary = find_apptainer(os.environ)
        version = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=20).stdout.strip()
        parts.append(f"apptainer: {version or binary}")
    except DistrainError as exc:
        parts.append(f"apptainer: not usable ({exc})")
    docker = shutil.which("docker")
    if docker:
        info = subprocess.run([docker, "info", "--format", "{{.ServerVersion}}"], capture_output=True, text=True,
                              timeout=20)
        parts.append(f"docker: server {info.stdout.strip()}" if info.returncode == 0
                     else f"docker: client only, no daemon reachable ({info.stderr.strip()[:120]})")
    else:
        parts.append("docker: not installed")
    return "containers: " + "; ".join(parts)


def _doctor_host(plan: Plan | None, problems: list[str]) -> None:
    """Proxies, the Apptainer cache, container tools, the driver's GPUs, /dev/shm, the trust model."""
    from ..user_site import describe

    typer.echo(describe(os.environ))
    proxies = [v for v in PROXY_VARS if os.environ.get(v)]
    typer.echo(f"proxies: {' '.join(proxies) if proxies else 'none set'}"
               + (" (unset for MWM by distrain run)" if proxies else ""))
    try:
        from .images import cache_dirs

        dirs, note = cache_dirs(os.environ)
        where = ", ".join(f"{k}={v}" for k, v in dirs.items())
        typer.echo(f"apptainer cache: {where}" + (f" ({note})" if note else ""))
    except DistrainError as exc:
        problems.append(str(exc))
    except ImportError:
        pass
    typer.echo(_container_tools())
    from ..gpus import gpu_device_files
    from .hostcheck import checkpoint_memory, driver_lines, shared_memory

    visible = plan.gpus_visible if plan else ()
    lines, warnings = driver_lines(visible, os.environ.get("CUDA_VISIBLE_DEVICES"), gpu_device_files())
    line, warning = shared_memory(len(visible))
    snapshot_line, snapshot_warning = checkpoint_memory(plan.checkpoint_async if plan else True)
    for text in [*lines, line, snapshot_line]:
        typer.echo(text)
    for text in [*warnings, *([warning] if warning else []), *([snapshot_warning] if snapshot_warning else [])]:
        typer.echo(f"warning: {text}")
    typer.echo(SECURITY_LINE)


def _doctor_tensorflow(plan: Plan | None, problems: list[str]) -> None:
    """TensorFlow's and Keras' versions, the CUDA it was built with against the driver, the GPUs it sees."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if plan is None or plan.family.aliased_as_keras:
        os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    try:
        import tensorflow as tf
    except ImportError as exc:
        problems.append(f"TensorFlow does not import: {exc}")
        return
    build = tf.sysconfig.get_build_info()
    typer.echo(f"tensorflow: {tf.__version__} (CUDA build: {build.get('is_cuda_build', False)}, "
               f"CUDA {build.get('cuda_version', '-')}, cuDNN {build.get('cudnn_version', '-')})")
    from ..compat.registry import library_version

    family = "tf_keras" if tf.keras.__name__.startswith("tf_keras") else "keras"  # keras or keras-nightly
    typer.echo(f"keras: {family} {library_version(family)}")
    if build.get("is_cuda_build"):  # the driver must support the CUDA this TensorFlow was built with
        from .selftest import FAIL, driver_row

        driver = driver_row(str(build.get("cuda_version") or ""))
        typer.echo(f"driver: {driver.detail}")
        if driver.status == FAIL:
            problems.append(f"driver: {driver.detail}")
    gpus = tf.config.list_physical_devices("GPU")
    typer.echo(f"GPUs seen by TensorFlow: {len(gpus)} {[g.name for g in gpus] if gpus else ''}".rstrip())
    if plan and plan.require_gpu and not gpus:
        from ..devices import NO_GPU_HINT

        problems.append(NO_GPU_HINT)


def _doctor_patches(plan: Plan | None, problems: list[str], every: bool) -> None:
    """The patches of other libraries (compat/registry.py) for the versions installed here: one line (`every`:
    each entry and its state, `distrain doctor --patches`)."""
    from ..compat import registry

    lines = registry.report()
    if every:
        typer.echo("patches of other libraries (compat/registry.py): name, Keras, kind, lifetime, modes, state")
        for line in lines:
            typer.echo(f"  {line}")
    else:
        moved = [line.split()[0] for line in lines if "MOVED" in line]
        versions = ", ".join(f"{name} {version}" for name in ("tensorflow", "keras", "tf_keras", "horovod")
                             if (version := registry.library_version(name)))
        state = f"{len(moved)} moved: {', '.join(moved)}" if moved else "all as proven"
        typer.echo(f"patches: {len(registry.PATCHES)} of {versions}: {state} (each: distrain doctor --patches)")
    if plan is not None:
        problems.extend(str(refusal) for refusal in registry.moved(plan.keras, plan.mode))


def _doctor_horovod(plan: Plan | None, problems: list[str]) -> None:
    try:
        import horovod
        import horovod.tensorflow as hvd
    except ImportError as exc:
        typer.echo(f"horovod: not available ({exc})")
        if plan and plan.mode == "horovod":
            problems.append("Horovod mode but Horovod does not import")
        return

    def built(yes: object) -> str:  # hvd.*_built() answer True/False, nccl_built() a version number or 0
        return "yes" if yes else "no"

    nccl = int(hvd.nccl_built())  # NCCL_VERSION_CODE: major * 10000 + minor * 100 + patch (NCCL >= 2.9)
    nccl_text = f"yes, {nccl // 10000}.{nccl // 100 % 100}.{nccl % 100}" if nccl >= 20900 else built(nccl)
    typer.echo(f"horovod: {horovod.__version__} (tensorflow: yes, mpi: {built(hvd.mpi_built())}, "
               f"gloo: {built(hvd.gloo_built())}, nccl: {nccl_text})")


def problems(plan: Plan | None, every_patch: bool = False) -> list[str]:
    """Run every check; the problems found (the Plan's own, when it could not be made, are the caller's).
    every_patch: list each patch of another library, not their one-line summary."""
    found: list[str] = []
    _doctor_host(plan, found)
    _doctor_tensorflow(plan, found)
    _doctor_horovod(plan, found)
    _doctor_patches(plan, found, every_patch)
    return found
