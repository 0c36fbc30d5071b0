"""On a machine with an NVIDIA GPU and its driver (skipped elsewhere, CI included): what distrain reads of the
GPUs without TensorFlow (`plan`, `doctor`, the selftest's driver row) against what nvidia-smi, the kernel module
and CUDA's own driver API report. TensorFlow is not needed: the GPU path through it is `distrain selftest`'s.

    python -m pytest tests/gpu -v        (on the GPU node, from a checkout; a plain python3 with typer will do)
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from helpers import ROOT

SMI = shutil.which("nvidia-smi")
pytestmark = pytest.mark.skipif(SMI is None, reason="no nvidia-smi: not a GPU node")

CUDA_COUNT = """import ctypes, sys
cuda = ctypes.CDLL("libcuda.so.1")
count = ctypes.c_int(-1)
code = cuda.cuInit(0)
if code == 0:
    code = cuda.cuDeviceGetCount(ctypes.byref(count))
print(0 if code == 100 else count.value if code == 0 else f"error {code}")  # 100: CUDA_ERROR_NO_DEVICE
"""


def distrain(*args: str, **env: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items()
            if not k.startswith(("SLURM_", "OMPI_", "PMI", "HOROVOD_", "DISTRAIN_", "TF_CONFIG", "CUDA_VISIBLE"))}
    return subprocess.run([sys.executable, "-m", "entrypoint", *args], cwd=ROOT, env={**base, **env},
                          capture_output=True, text=True, timeout=300)


def smi_gpus() -> list[list[str]]:
    out = subprocess.run([SMI, "--query-gpu=index,name,pci.bus_id,driver_version,memory.total,compute_cap",
                          "--format=csv,noheader"], capture_output=True, text=True, check=True, timeout=300).stdout
    return [[f.strip() for f in line.split(",")] for line in out.strip().splitlines()]


def cuda_device_count(cuda_visible: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    if cuda_visible is not None:
        env["CUDA_VISIBLE_DEVICES"] = cuda_visible
    return subprocess.run([sys.executable, "-c", CUDA_COUNT], env=env, capture_output=True, text=True,
                          timeout=120).stdout.strip()


def test_the_plan_counts_the_gpus_the_driver_shows():
    plan = json.loads(distrain("plan", "--json").stdout)
    assert len(plan["gpus_visible"]) == len(smi_gpus()) > 0
    assert plan["gpus_visible"] == [str(i) for i in range(len(smi_gpus()))]  # CUDA's numbers, from 0
    assert plan["devices"] == ["0"] and plan["mode"] in ("single", "mirrored")


def test_the_gpu_distrain_pins_is_one_cuda_opens():
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        pytest.skip(f"CUDA's driver library does not load here: {exc}")
    gpus = len(smi_gpus())
    assert cuda_device_count(None) == str(gpus)
    single = json.loads(distrain("plan", "--json", DISTRAIN_MODE="single").stdout)
    assert cuda_device_count(single["env_set"]["CUDA_VISIBLE_DEVICES"]) == "1"
    # negative control: an index CUDA does not have (what pinning a /dev/nvidiaN by its N did in a container
    # given another GPU than the host's first) leaves CUDA nothing: cuInit answers CUDA_ERROR_NO_DEVICE
    assert cuda_device_count(str(gpus)) == "0"


def test_doctor_shows_the_driver_the_gpus_and_shared_memory():
    out = distrain("doctor")
    assert out.returncode in (0, 3), out.stdout + out.stderr  # 3: a problem, e.g. no TensorFlow in this Python
    problems = [line for line in out.stderr.splitlines() if line.startswith("problem:")]
    assert "Traceback" not in out.stderr and all(len(p) < 400 for p in problems), out.stderr
    gpus = smi_gpus()
    assert f"GPUs (nvidia-smi): {len(gpus)}, driver {gpus[0][3]}" in out.stdout, out.stdout
    for index, name, bus, _, memory, cap in gpus:
        assert f"GPU {index}: {name}, {memory.split()[0]} MiB, compute capability {cap}, PCI {bus}" in out.stdout
    statvfs = os.statvfs("/dev/shm")
    assert f"shared memory: /dev/shm {statvfs.f_blocks * statvfs.f_frsize / 2**20:.0f} MiB" in out.stdout
    assert "warning: nvidia-smi shows" not in out.stdout and "warning: GPU device files" not in out.stdout


def test_the_kernel_module_and_nvidia_smi_agree_on_the_driver():
    from entrypoint.tools.hostcheck import kernel_driver_version

    module = kernel_driver_version()
    if not module:
        pytest.skip("no /proc/driver/nvidia/version here")
    assert module == smi_gpus()[0][3]


def test_the_selftest_driver_row_reads_the_drivers_cuda():
    from entrypoint.tools.selftest import driver_row

    header = subprocess.run([SMI], capture_output=True, text=True, timeout=300).stdout
    supported = re.search(r"CUDA Version:\s*([\d.]+)", header).group(1)
    assert driver_row(supported).status == "pass"
    newer = f"{int(supported.split('.')[0]) + 1}.0"
    assert driver_row(newer).status == "fail" and f"older than the image's CUDA {newer}" in driver_row(newer).detail


NCCL_ONE_RANK = """import os, torch, torch.distributed as dist
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29533")
dist.init_process_group("nccl", rank=0, world_size=1)
tensor = torch.ones(2**20, device="cuda")
dist.all_reduce(tensor)
torch.cuda.synchronize()
dist.destroy_process_group()
"""


def test_the_selftest_names_the_network_nccls_own_log_chose():
    """A real NCCL's INFO log (PyTorch's, where this Python has it: TensorFlow's NCCL writes the same lines),
    read as the selftest reads its ranks' logs: the network is the one NCCL's verdict names."""
    pytest.importorskip("torch")
    from entrypoint.tools.selftest import collective_used

    out = subprocess.run([sys.executable, "-c", NCCL_ONE_RANK], env={**os.environ, "NCCL_DEBUG": "INFO"},
                         capture_output=True, text=True, timeout=300)
    log = out.stdout + out.stderr
    assert out.returncode == 0, log[-3000:]
    (verdict,) = set(re.findall(r"NCCL INFO Using network (\w+)", log))
    named = collective_used({"size": 2, "mode": "mwm"}, log)
    assert named.startswith(f"NCCL over {verdict}"), (named, log[-3000:])
