"""Real container builds: Docker (Debian's docker.io) and Apptainer, on a local CPU base image.

The base (scripts/build-test-base.sh) is built once per machine and reused; the project's Dockerfile and
Apptainer.def are built for real every session, unchanged but for BASE_IMAGE.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from helpers import (
    ROOT,
    TEST_USER,
    USERS_PIP_CACHE,
    account_exists,
    as_the_user,
    clean_env,
    copy_of_the_checkout,
    the_users_own,
)

DOCKER = "/usr/bin/docker"
BASE_TAR = Path(os.environ.get("DISTRAIN_TEST_BASE_TAR", "/var/cache/distrain/test-base-tf2.17.1.tar"))
BASE_TAG = "distrain-test-base:tf2.17.1"
CPU_BASE_CARRIES = "tensorflow=2.17 keras=3.3 tf_keras=2.17 horovod=0.28.1"  # NGC's, less CUDA and NCCL (EXPECT)
REGISTRY = "127.0.0.1:5000"
APPTAINER_HOME = Path(os.environ.get("DISTRAIN_APPTAINER_HOME", "/opt/distrain-apptainer"))
APPTAINER_CACHE = Path(os.environ.get("DISTRAIN_TEST_APPTAINER_CACHE", "/var/cache/distrain/apptainer"))
# lz4, not Apptainer's default gzip: the test image's build took 109 s with gzip, 47 s with lz4 (671 MB, not 464).
# Apptainer's own setting (build --mksquashfs-args, from the environment): the image files are built unchanged.
SQUASHFS_FOR_TESTS = "-comp lz4"
USERS_APPTAINER_CACHE = Path(f"/var/cache/distrain/apptainer-{TEST_USER}")  # the account's, kept between sessions


def container_env(**extra: str) -> dict[str, str]:
    """The environment for docker/apptainer commands: our daemon's socket, the relocated apptainer on PATH."""
    env = clean_env(DOCKER_HOST="unix:///run/distrain-containers/docker.sock", APPTAINER_NOHTTPS="1",
                    # root in this sandbox lacks CAP_SYS_RESOURCE, which apptainer would otherwise try to keep
                    APPTAINER_DROP_CAPS="CAP_SYS_RESOURCE")
    env["PATH"] = f"{APPTAINER_HOME / 'bin'}:{env['PATH']}"
    env.update(extra)
    return env


def sh(cmd: list[str], timeout: float = 900, cwd: Path = ROOT, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, env=container_env(**env), cwd=cwd, text=True, timeout=timeout,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


@pytest.fixture(scope="session")
def docker():
    """dockerd + local registry (started by the project's script), with the test base image loaded and pushed."""
    if not shutil.which("dockerd"):
        pytest.skip("docker.io is not installed (scripts/install.sh installs it)")
    running = sh(["scripts/container-services.sh", "env"]).returncode == 0 and \
        sh([DOCKER, "info"], timeout=30).returncode == 0
    started = sh(["scripts/container-services.sh", "start"], timeout=120)
    if started.returncode != 0:
        pytest.skip(f"dockerd cannot run here: {started.stdout.strip()[-500:]}")
    if sh([DOCKER, "image", "inspect", BASE_TAG], timeout=60).returncode != 0:
        built = sh(["scripts/build-test-base.sh", str(BASE_TAR)], timeout=1200)
        assert built.returncode == 0, built.stdout[-3000:]
        imported = sh([DOCKER, "import", str(BASE_TAR), BASE_TAG], timeout=600)
        assert imported.returncode == 0, imported.stdout
    remote = f"{REGISTRY}/{BASE_TAG}"
    assert sh([DOCKER, "tag", BASE_TAG, remote]).returncode == 0
    pushed = sh([DOCKER, "push", "-q", remote], timeout=600)
    assert pushed.returncode == 0, pushed.stdout[-2000:]
    yield remote
    if not running:
        sh(["scripts/container-services.sh", "stop"], timeout=120)


@pytest.fixture(scope="session")
def docker_image(docker):
    out = sh([DOCKER, "build", "--build-arg", f"BASE_IMAGE={BASE_TAG}", "--build-arg", f"EXPECT={CPU_BASE_CARRIES}",
              "-t", "distrain:test", "."], timeout=900)
    assert out.returncode == 0, out.stdout[-3000:]
    return "distrain:test"


def the_accounts_workspace(prefix: str, caches: tuple[Path, ...]) -> Path:
    """A directory under /var/tmp for the ordinary account (TEST_USER), with its own copy of the checkout; its
    caches made and its own. The caller makes the whole its own (`the_users_own`) once it has added to it."""
    work = Path(tempfile.mkdtemp(prefix=prefix, dir="/var/tmp"))  # the account's, where it can write
    copy_of_the_checkout(work / "distrain")
    for cache in caches:
        cache.mkdir(mode=0o700, parents=True, exist_ok=True)
        the_users_own(cache)
    return work


def the_accounts_env(path_first: str = "", **extra: str) -> dict[str, str]:
    """A login's variables for the account building an image: its home, Apptainer, its caches kept between
    sessions as a login node's are, the tests' fast squashfs."""
    return {"HOME": os.path.expanduser(f"~{TEST_USER}"), "PATH": f"{path_first}{APPTAINER_HOME / 'bin'}:/usr/bin:/bin",
            "APPTAINER_NOHTTPS": "1", "DISTRAIN_CACHE": str(USERS_APPTAINER_CACHE),
            "PIP_CACHE_DIR": str(USERS_PIP_CACHE), "APPTAINER_MKSQUASHFS_ARGS": SQUASHFS_FOR_TESTS,
            "PIP_DISABLE_PIP_VERSION_CHECK": "1", **extra}


def the_readmes_first_step(work: Path) -> str:
    """The README's first step in the account's workspace: a virtualenv with its copy of distrain."""
    return f"python3 -m venv {work}/command && {work}/command/bin/pip install -q {work}/distrain"


@pytest.fixture(scope="session")
def sif(docker):
    """The project's Apptainer.def built by `distrain image build` as an ordinary account, as a user without an
    admin builds it: TEST_USER (no root: `--fakeroot` with the subordinate ids scripts/install.sh gives it), with
    the `distrain` command it installs as the README's first step (a virtualenv from its own copy of the
    checkout), from a directory outside the checkout, on the base from the local registry. --notest: its %test
    (doctor, then the selftest of every mode) runs in test_apptainer_plan_test_and_labels, not twice. The
    account's Apptainer cache (the base image's layers, by digest) is kept between sessions, as a login node's is."""
    if not (APPTAINER_HOME / "bin" / "apptainer").exists() and not shutil.which("apptainer"):
        pytest.skip("apptainer is not installed (scripts/install.sh runs scripts/setup-apptainer.sh)")
    if not account_exists():
        pytest.skip(f"no account {TEST_USER}: scripts/install.sh makes it")
    work = the_accounts_workspace("distrain-sif-", (USERS_APPTAINER_CACHE, USERS_PIP_CACHE))
    (work / "elsewhere").mkdir()
    the_users_own(work)
    image = work / "distrain.sif"
    env = the_accounts_env()
    command = (f"{the_readmes_first_step(work)} && cd elsewhere && {work}/command/bin/distrain image build {image} "
               f"--base-image {docker} --notest "
               f"--expect '{CPU_BASE_CARRIES}'")
    out = as_the_user(command, work, env, timeout=1200)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert f"distrain: built {image}" in out.stdout + out.stderr
    assert image.stat().st_uid != 0  # the account's own image
    yield image
    shutil.rmtree(work, ignore_errors=True)
