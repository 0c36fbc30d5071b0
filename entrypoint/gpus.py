"""The GPUs a process may use and the ones it drives, decided without CUDA (for the Plan: plan.py)."""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Mapping

from .errors import ConfigError


def probe_gpus(env: Mapping[str, str], dev: str = "/dev") -> tuple[str, ...]:
    """GPU ids this process may use, as CUDA numbers them, without CUDA: CUDA_VISIBLE_DEVICES if set, else one
    per /dev/nvidiaN device file.

    Slurm, `docker --gpus` and `apptainer --nv` all narrow one of these, and neither needs `nvidia-smi`. CUDA
    numbers the GPUs it can open from 0, whatever their N: a container given the host's GPU 3 (`docker run
    --gpus device=3`, NVIDIA_VISIBLE_DEVICES=3) holds /dev/nvidia3 alone and CUDA calls it 0 (nvidia-docker#907),
    so pinning "3" there would hide the GPU and train on the CPU.
    """
    cvd = env.get("CUDA_VISIBLE_DEVICES")
    if cvd is not None:
        ids = [d.strip() for d in cvd.split(",") if d.strip()]
        if not ids or ids[0] in ("-1", "NoDevFiles") or ids[0].startswith("-"):
            return ()
        return tuple(ids)
    return tuple(str(index) for index in range(len(gpu_device_files(dev))))


def gpu_device_files(dev: str = "/dev") -> list[str]:
    """The /dev/nvidiaN files (not nvidiactl, nvidia-uvm, nvidia-caps), by N."""
    names = [os.path.basename(p) for p in glob.glob(os.path.join(dev, "nvidia[0-9]*"))]
    return sorted((os.path.join(dev, n) for n in names if re.fullmatch(r"nvidia\d+", n)),
                  key=lambda path: int(path.rsplit("nvidia", 1)[1]))


def gpus_reason(env: Mapping[str, str], gpus: tuple[str, ...]) -> str:
    if env.get("CUDA_VISIBLE_DEVICES") is not None:
        return "CUDA_VISIBLE_DEVICES"
    files = gpu_device_files()
    if len(files) != len(gpus) or not files:
        return "/dev/nvidia*"
    shown = ",".join(f.removeprefix("/dev/") for f in files)
    numbered = [f.removeprefix("/dev/nvidia") for f in files] == list(gpus)
    return f"/dev/nvidia*: {shown}" + ("" if numbered else " (CUDA numbers them from 0)")


def pick_devices(mode: str, gpus: tuple[str, ...], local_rank: int, local_size: int) -> tuple[tuple[str, ...], str]:
    """The GPUs this process drives: a node's visible GPUs are shared evenly among its tasks, a contiguous block
    by local rank (4 GPUs, 2 tasks: local rank 1 gets 2,3; one task: all four, which MWM mirrors over)."""
    if not gpus:
        return (), "no GPU visible: CPU"
    if mode == "mirrored":
        return gpus, f"all {len(gpus)} visible GPUs in one process"
    if mode == "single":
        note = " (restricted so XLA does not spread over the others)" if len(gpus) > 1 else ""
        return gpus[:1], f"one GPU{note}"
    if len(gpus) == 1:
        return gpus, "the one GPU this task was given"
    if len(gpus) % local_size:
        raise ConfigError(
            f"{local_size} tasks on this node share {len(gpus)} visible GPUs, which do not split evenly: ask for one "
            f"GPU per task (--gpus-per-task=1) or make the GPUs per node a multiple of --ntasks-per-node"
        )
    share = len(gpus) // local_size
    if mode == "horovod" and share > 1:
        raise ConfigError(
            f"Horovod drives one GPU per process but {len(gpus)} GPUs are visible to {local_size} task(s) on this "
            "node: run one task per GPU (--ntasks-per-node equal to the GPUs, or --gpus-per-task=1)"
        )
    block = gpus[local_rank * share:(local_rank + 1) * share]
    if share == 1:
        return block, f"GPU by local rank {local_rank} of {len(gpus)} visible"
    return block, f"{share} of the node's {len(gpus)} GPUs, by local rank {local_rank}; MWM mirrors over them"
