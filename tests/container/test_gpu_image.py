"""The pypi flavour (TensorFlow 2.21 with PyPI's CUDA, Horovod with NCCL), built for real here without a GPU, by an
ordinary account (no root: `--fakeroot`), and checked as far as a machine without one can: TensorFlow is a CUDA
build, Horovod has NCCL, MPI and Gloo and loads PyPI's NCCL, and `distrain doctor` in the image says so with the
driver it needs. Several GB and a Horovod compile: only with `-m gpu_image` (scripts/test.sh -m gpu_image),
neither in CI's tier nor in --full."""

import os
import re
import shlex
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from container_fixtures import (
    DOCKER,
    REGISTRY,
    USERS_APPTAINER_CACHE,
    sh,
    the_accounts_env,
    the_accounts_workspace,
    the_readmes_first_step,
)
from helpers import (
    TEST_USER,
    USERS_PIP_CACHE,
    account_exists,
    as_the_user,
    assert_trained_in_sync,
    clean_env,
    the_users_own,
)
from readme_blocks import block
from slurm_jobs import submit

pytestmark = pytest.mark.gpu_image

# the account's wheelhouse: fetched and Horovod built by its first run, kept between sessions as its pip cache is
WHEELHOUSE = Path(os.environ.get("DISTRAIN_TEST_GPU_WHEELHOUSE",
                                 f"/var/cache/distrain/wheelhouse-gpu-tf2.21-{TEST_USER}"))
OS_BASE_TAR = Path("/var/cache/distrain/test-base-debian12.tar")
OS_BASE = f"{REGISTRY}/distrain-test-os:debian12"


@pytest.fixture(scope="module")
def gpu_sif(docker):
    """The README's two commands (the wheelhouse: fetched, Horovod built once and cached; then `distrain image build
    --flavour pypi`) as an ordinary account (TEST_USER: `--fakeroot` with the subordinate ids scripts/install.sh
    gives it), from its own copy of the checkout with the `distrain` of the README's first step, timed; on a plain
    Debian 12 from the local registry for the base (the stand-in for docker.io's debian:12, which this machine
    cannot pull: made by root, as the registry is) and without the image's %test (no GPU here)."""
    if not account_exists():
        pytest.skip(f"no account {TEST_USER}: scripts/install.sh makes it")
    if not shutil.which("clang++-19"):  # Horovod's CUDA kernels (scripts/gpu-wheelhouse.sh), as docs/admins.md says
        pytest.skip("no clang++-19: apt-get install clang-19 (docs/admins.md)")
    if sh([DOCKER, "image", "inspect", OS_BASE], timeout=60).returncode != 0:
        built = sh(["scripts/build-test-base.sh", str(OS_BASE_TAR)], timeout=1200, TF_VERSION="none")
        assert built.returncode == 0, built.stdout[-3000:]
        assert sh([DOCKER, "import", str(OS_BASE_TAR), OS_BASE], timeout=600).returncode == 0
    assert sh([DOCKER, "push", "-q", OS_BASE], timeout=600).returncode == 0
    work = the_accounts_workspace("distrain-gpu-sif-", (WHEELHOUSE, USERS_APPTAINER_CACHE, USERS_PIP_CACHE))
    (work / "scratch").mkdir()
    (work / "scratch" / "wheelhouse").symlink_to(WHEELHOUSE)
    the_users_own(work)
    image = work / "distrain-tf221.sif"
    command = block("gpu-image").replace(" distrain-tf221.sif", f" {image} --base-image {OS_BASE} --notest")
    env = the_accounts_env(f"{work}/command/bin:", SCRATCH=str(work / "scratch"))
    started = time.monotonic()
    out = as_the_user(f"{the_readmes_first_step(work)} && cd {work}/distrain && {command}", work, env, timeout=3600)
    seconds = time.monotonic() - started
    log = out.stdout + out.stderr
    assert out.returncode == 0, log[-5000:]
    assert image.stat().st_uid != 0  # the account's own image
    wheelhouse = subprocess.run(["du", "-sh", "--dereference", str(WHEELHOUSE)], capture_output=True, text=True,
                                timeout=120).stdout.split()[0]
    print(f"pypi flavour as {TEST_USER}: the README's commands took {seconds:.0f} s; the image is "
          f"{image.stat().st_size / 2**30:.2f} GiB (squashfs with lz4); the wheelhouse {wheelhouse}")
    yield image, log
    shutil.rmtree(work, ignore_errors=True)


def as_the_account(args: list[str], image: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    """`args` as the account that built `image`, as it would check and run its own image; stderr after stdout."""
    out = as_the_user(shlex.join(args), image.parent, the_accounts_env(), timeout)
    return subprocess.CompletedProcess(out.args, out.returncode, out.stdout + out.stderr)


def test_the_pypi_flavour_is_tensorflow_221_built_with_cuda_and_horovod_with_nccl(gpu_sif):
    image, build_log = gpu_sif
    checks = [line for line in build_log.splitlines() if line.startswith("image/install.sh: ")]
    print("\n".join(checks))
    for check in ("TensorFlow is a CUDA build: True", "Horovod has MPI: True", "Horovod has Gloo: True"):
        assert f"image/install.sh: {check}" in checks, checks
    assert re.search(r"^image/install\.sh: Horovod has NCCL: [1-9]\d*$", build_log, re.M), checks
    assert re.search(r"^image/install\.sh: built with CUDA 12\.\d+(\.\d+)?, cuDNN 9", build_log, re.M), checks
    # Horovod's TensorFlow ops load PyPI's NCCL from site-packages (their rpath), found without LD_LIBRARY_PATH
    assert re.search(r"Horovod links libnccl\.so\.2 => /usr/local/lib/python3\.11/dist-packages/horovod/tensorflow/"
                     r"\.\./\.\./nvidia/nccl/lib/libnccl\.so\.2 ", build_log), checks

    doctor = as_the_account(["apptainer", "run", "--env", "DISTRAIN_REQUIRE_GPU=0", str(image), "doctor"], image)
    print(doctor.stdout)
    assert doctor.returncode == 0, doctor.stdout[-3000:]
    assert re.search(r"^tensorflow: 2\.21\.0 \(CUDA build: True, CUDA 12\.\d+\.\d+, cuDNN 9\)$", doctor.stdout, re.M)
    assert re.search(r"^driver: .*needs a driver for CUDA 12\.\d+ or newer \(Linux \d+\.\d+\.\d+\+\)$",
                     doctor.stdout, re.M), doctor.stdout
    assert re.search(r"^keras: keras 3\.15\.1$", doctor.stdout, re.M)
    assert re.search(r"^horovod: 0\.28\.1 \(tensorflow: yes, mpi: yes, gloo: yes, nccl: yes, 2\.\d+\.\d+\)$",
                     doctor.stdout, re.M), doctor.stdout
    labels = as_the_account(["apptainer", "inspect", str(image)], image).stdout
    assert "distrain.flavour: pypi" in labels
    wheelhouse_left = as_the_account(["apptainer", "exec", str(image), "ls", "/opt/distrain"], image).stdout.split()
    assert "wheelhouse" not in wheelhouse_left  # installed from, not shipped


def test_the_pypi_flavour_trains_on_cpu_with_both_keras_families(gpu_sif):
    """The same image on a node without a GPU (DISTRAIN_REQUIRE_GPU=0): Keras 3 and tf_keras train."""
    image, _ = gpu_sif
    for family in ("keras3", "legacy"):
        examples = image.parent / "distrain" / "examples"  # the account's copy
        out = as_the_account(["apptainer", "run", "--env", "DISTRAIN_REQUIRE_GPU=0", "--env",
                              f"DISTRAIN_KERAS={family}", "--bind", f"{examples}:/examples", str(image),
                              "/examples/train.py", "--epochs", "2"], image, timeout=600)
        assert out.returncode == 0, out.stdout[-3000:]
        assert_trained_in_sync(out.stdout, workers=1)


@pytest.mark.parametrize("job", ["mwm", "horovod"])
def test_the_job_scripts_run_the_pypi_image_under_slurm(gpu_sif, slurm, tmp_path, job):
    """jobs/mwm.job and jobs/horovod.job with the pypi image, on the local Slurm's 2 nodes (CPU: what differs from a
    GPU node is the GPU alone): MWM through srun, Horovod through `srun --mpi=pmix` into the image's Open MPI
    (Debian 12's, as in the CPU test image the CI's job tests use)."""
    image, _ = gpu_sif
    env = {"USE_CONTAINER": "1", "DISTRAIN_IMAGE": str(image), "APPTAINERENV_DISTRAIN_REQUIRE_GPU": "0",
           "APPTAINER_DROP_CAPS": "CAP_SYS_RESOURCE", "PATH": f"/opt/distrain-apptainer/bin:{clean_env()['PATH']}"}
    ran = submit(slurm, tmp_path, job, ["--cpus-per-task=1", "--time=10", "--nodes=2", "--ntasks-per-node=1",
                                        "--gres=gpu:1"], ["--epochs", "2"], **env)
    assert ran.code == 0, ran.log[-3000:]
    srun = ": srun --kill-on-bad-exit=1 --mpi=pmix " if job == "horovod" else ": srun --kill-on-bad-exit=1 "
    assert f"{job} on 2 worker(s)" in ran.log and srun in ran.log, ran.log[-3000:]
    assert "apptainer run --nv --bind" in ran.log, ran.log[-3000:]
    assert_trained_in_sync(ran.log, workers=2)
