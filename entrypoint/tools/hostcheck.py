"""Checks of the host (or container) that need no TensorFlow, for `doctor` and `selftest`: the GPUs and driver
as nvidia-smi and the kernel module report them, and shared memory: NCCL passes data between the GPUs of one node
through /dev/shm, and Docker's default (64 MiB) makes several-GPU runs fail or hang (`docker run --shm-size=1g`,
or `--ipc=host`)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass

SHM_NEEDED = 1 << 30  # 1 GiB: comfortably above what NCCL's buffers take for 8 GPUs
SNAPSHOT_MEMORY = 8 << 30  # host memory available below which a large model's checkpoint snapshot may not fit


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


def checkpoint_memory(in_background: bool, meminfo: str = "/proc/meminfo") -> tuple[str, str | None]:
    """Checkpoints written off the training's path hold one copy of the model's weights and optimizer
    state in host memory while they are written (fit/checkpoint_snapshot.py): the memory there is for it."""
    if not in_background:
        return "checkpoints: written in place (DISTRAIN_CHECKPOINT_ASYNC=0)", None
    try:
        with open(meminfo) as handle:
            available = next(int(line.split()[1]) << 10 for line in handle if line.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError, IndexError):
        return "checkpoints: written off the training's path (host memory unknown)", None
    line = (f"checkpoints: written off the training's path, a copy of the model's state in host memory "
            f"while each is written ({available / 2**30:.1f} GiB available)")
    if available < SNAPSHOT_MEMORY:
        return line, (f"only {available / 2**30:.1f} GiB of host memory available: a checkpoint in flight holds a "
                      "copy of the model's weights and optimizer state (3x the weights with Adam); for a model near "
                      "that size set DISTRAIN_CHECKPOINT_ASYNC=0")
    return line, None


# ---- the NVIDIA driver, as nvidia-smi and the kernel module report it ----

NO_NVIDIA_SMI = "no nvidia-smi: no NVIDIA driver here (or the container was started without --nv / --gpus)"
GPU_QUERY = "index,name,pci.bus_id,driver_version,memory.total,compute_cap"


@dataclass(frozen=True)
class NvidiaGpu:
    index: str
    name: str
    pci_bus_id: str
    driver: str
    memory_mib: int
    compute_cap: str

    def line(self) -> str:
        return (f"GPU {self.index}: {self.name}, {self.memory_mib} MiB, compute capability {self.compute_cap}, "
                f"PCI {self.pci_bus_id}")


def parse_gpu_query(text: str) -> list[NvidiaGpu]:
    """`nvidia-smi --query-gpu=GPU_QUERY --format=csv,noheader,nounits` (a header line, if any, is skipped)."""
    gpus = []
    for line in text.strip().splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) < 6 or not fields[0].isdigit():
            continue
        index, *name, bus, driver, memory, cap = fields  # a name never has a comma, but it would stay whole
        gpus.append(NvidiaGpu(index, ", ".join(name), bus, driver, int(memory) if memory.isdigit() else 0, cap))
    return gpus


def nvidia_gpus(smi: str | None = None) -> tuple[list[NvidiaGpu], str]:
    """The GPUs the NVIDIA driver shows this process (the device files the container was given), or why none:
    no nvidia-smi (no driver, or no `--nv` / `--gpus`), or nvidia-smi's own first line when it fails."""
    binary = smi or shutil.which("nvidia-smi")
    if binary is None:
        return [], NO_NVIDIA_SMI
    try:
        done = subprocess.run([binary, f"--query-gpu={GPU_QUERY}", "--format=csv,noheader,nounits"],
                              capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return [], f"nvidia-smi did not answer: {exc}"
    gpus = parse_gpu_query(done.stdout)
    if done.returncode != 0 or not gpus:
        said = (done.stdout + done.stderr).strip().splitlines() or [f"exit {done.returncode}, no output"]
        return [], f"nvidia-smi: {said[0][:160]}"
    return gpus, ""


def kernel_driver_version(path: str = "/proc/driver/nvidia/version") -> str:
    """The loaded kernel module's version (`NVRM version: ... Kernel Module for x86_64  580.159.04  Release ...`):
    the first N.N.N on its first line; "" where no NVIDIA module is loaded (or /proc is not the host's)."""
    try:
        with open(path) as handle:
            first = handle.readline()
    except OSError:
        return ""
    found = re.search(r"\b(\d+\.\d+(?:\.\d+)?)\b", first)
    return found.group(1) if found else ""


def driver_lines(visible: tuple[str, ...], cuda_visible: str | None, dev_files: list[str],
                 smi: str | None = None) -> tuple[list[str], list[str]]:
    """`doctor`'s GPU section: what the driver shows, and warnings where CUDA will not see what the node has.
    `visible` is the Plan's GPUs, `cuda_visible` CUDA_VISIBLE_DEVICES, `dev_files` the /dev/nvidiaN files."""
    gpus, why_none = nvidia_gpus(smi)
    module = kernel_driver_version()
    lines, warnings = [], []
    if gpus:
        drivers = sorted({g.driver for g in gpus})
        lines.append(f"GPUs (nvidia-smi): {len(gpus)}, driver {', '.join(drivers)}"
                     + (f" (kernel module {module})" if module and module not in drivers else ""))
        lines += [f"  {g.line()}" for g in gpus]
        if not visible:
            hidden_by = (f"CUDA_VISIBLE_DEVICES={cuda_visible!r} hides them all" if cuda_visible is not None else
                         "no /dev/nvidiaN device file is here")
            warnings.append(f"nvidia-smi shows {len(gpus)} GPU(s) but {hidden_by}: this run would train on the CPU")
        return lines, warnings
    lines.append(f"GPUs (nvidia-smi): none; {why_none}" + (f"; kernel module {module}" if module else ""))
    if dev_files:
        warnings.append(f"GPU device files {', '.join(dev_files)} are here but the driver does not answer "
                        f"({why_none}): TensorFlow will see no GPU; in Apptainer add --nv, in Docker --gpus all")
    return lines, warnings
