"""doctor's GPU section (entrypoint/tools/hostcheck.py) from what nvidia-smi and the kernel module print, as read on a
real H100 node (tests/gpu/ checks the same against a real driver where one is lent)."""

import stat

from entrypoint.tools.hostcheck import driver_lines, kernel_driver_version, nvidia_gpus, parse_gpu_query

H100 = "0, NVIDIA H100 80GB HBM3, 00000000:00:06.0, 580.159.04, 81559, 9.0\n"
PROC = ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build  "
        "(dvs-builder@U16-I3-B13-4-3)  Thu Oct 30 00:00:00 UTC 2025\nGCC version:  gcc version 12.2.0\n")


def fake_nvidia_smi(tmp_path, stdout: str, code: int = 0) -> str:
    path = tmp_path / "nvidia-smi"
    path.write_text(f"#!/bin/sh\nprintf '%s' '{stdout}'\nexit {code}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def test_the_gpu_query_is_read_field_by_field():
    (gpu,) = parse_gpu_query("index, name, pci.bus_id, driver_version, memory.total [MiB], compute_cap\n" + H100)
    assert (gpu.index, gpu.name, gpu.pci_bus_id, gpu.driver, gpu.memory_mib, gpu.compute_cap) == (
        "0", "NVIDIA H100 80GB HBM3", "00000000:00:06.0", "580.159.04", 81559, "9.0")
    assert gpu.line() == "GPU 0: NVIDIA H100 80GB HBM3, 81559 MiB, compute capability 9.0, PCI 00000000:00:06.0"
    assert parse_gpu_query("No devices were found\n") == []


def test_the_kernel_modules_version_is_its_first_version_number(tmp_path):
    (tmp_path / "version").write_text(PROC)
    assert kernel_driver_version(str(tmp_path / "version")) == "580.159.04"
    assert kernel_driver_version(str(tmp_path / "absent")) == ""


def test_doctor_lists_the_gpus_and_warns_when_cuda_would_see_none(tmp_path):
    smi = fake_nvidia_smi(tmp_path, H100)
    lines, warnings = driver_lines(("0",), None, ["/dev/nvidia0"], smi=smi)
    assert lines[0].startswith("GPUs (nvidia-smi): 1, driver 580.159.04") and "NVIDIA H100 80GB HBM3" in lines[1]
    assert warnings == []
    _, hidden = driver_lines((), "", ["/dev/nvidia0"], smi=smi)
    assert hidden == ["nvidia-smi shows 1 GPU(s) but CUDA_VISIBLE_DEVICES='' hides them all: this run would train "
                      "on the CPU"]


def test_device_files_without_a_working_driver_say_how_to_start_the_container(tmp_path):
    """Apptainer binds the host's /dev: without --nv the GPU's device files are there, its driver is not."""
    lines, warnings = driver_lines(("0",), None, ["/dev/nvidia0"], smi=str(tmp_path / "absent-nvidia-smi"))
    assert lines[0].startswith("GPUs (nvidia-smi): none; ") and len(warnings) == 1
    assert "/dev/nvidia0" in warnings[0] and "add --nv" in warnings[0]
    broken = fake_nvidia_smi(tmp_path, "Failed to initialize NVML: Driver/library version mismatch", code=18)
    gpus, why = nvidia_gpus(broken)
    assert gpus == [] and why == "nvidia-smi: Failed to initialize NVML: Driver/library version mismatch"
    assert driver_lines((), None, [], smi=str(tmp_path / "absent-nvidia-smi"))[1] == []  # a CPU node: no warning
