"""Checks of the host (or container) that need no TensorFlow, for `doctor`: each returns a line to show and a
warning or None. Shared memory first: NCCL passes data between the GPUs of one node through /dev/shm, and
Docker's default (64 MiB) makes several-GPU runs fail or hang (`docker run --shm-size=1g`, or `--ipc=host`)."""

from __future__ import annotations

import os

SHM_NEEDED = 1 << 30  # 1 GiB: comfortably above what NCCL's buffers take for 8 GPUs


def shared_memory(gpus: int, path: str = "/dev/shm") -> tuple[str, str | None]:
    try:
        info = os.statvfs(path)
    except OSError as exc:
        return f"shared memory: {path} unavailable ({exc.strerror})", (
            f"{path} is unavailable: NCCL needs it between GPUs of one node" if gpus > 1 else None)
    size = info.f_blocks * info.f_frsize
    line = f"shared memory: {path} {size / 2**20:.0f} MiB"
    if gpus > 1 and size < SHM_NEEDED:
        return line, (f"{path} is only {size / 2**20:.0f} MiB for {gpus} GPUs: NCCL between them needs more; "
                      "with Docker add --shm-size=1g (or --ipc=host)")
    return line, None
