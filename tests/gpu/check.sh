#!/usr/bin/env bash
# check.sh OUT_DIR - on a GPU node, from a checkout: the TensorFlow-free GPU checks (tests/gpu and the driver
# parsing's unit tests), `distrain doctor` and `plan`, the selftest's environment rows, and the raw facts they
# are judged against (nvidia-smi, device files, the kernel module, /dev/shm), each into OUT_DIR.
# Needs a python3 with pytest and typer; TensorFlow is not needed (doctor then exits 3, naming it).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
out=${1:?usage: tests/gpu/check.sh OUT_DIR}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
{
  nvidia-smi
  nvidia-smi --query-gpu=index,name,pci.bus_id,driver_version,memory.total,compute_cap --format=csv
  ls -la /dev/nvidia* /dev/infiniband
  cat /proc/driver/nvidia/version
  df -h /dev/shm
  env | grep -E '^(NVIDIA|CUDA|NCCL)' | sort
  python3 --version
} >"$out/facts.txt" 2>&1
python3 -m pytest -p no:cacheprovider -v -o addopts="-ra" tests/gpu tests/unit/test_gpu_driver.py \
  tests/unit/test_selftest_checks.py "tests/unit/test_plan.py::test_probe_gpus_numbers_the_device_files_as_cuda_does" \
  2>&1 | tee "$out/pytest.txt"
rc=$?
{ python3 -m entrypoint doctor; echo "doctor exit $?"; python3 -m entrypoint plan; } >"$out/doctor.txt" 2>&1
python3 - >"$out/selftest-rows.txt" 2>&1 <<'PY'
import os
from entrypoint.tools import selftest
for gpus in (1, 2):  # 2: the /dev/shm row is judged only for several GPUs
    print(selftest.report(selftest.environment_rows(os.environ, "12.8", gpus)))
print("fastest link:", selftest.link_gbits())
PY
exit "$rc"
