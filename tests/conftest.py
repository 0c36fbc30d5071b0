"""Each test folder is a marker: unit, integration, horovod, slurm, container, bench, compat."""

import os
import subprocess
from pathlib import Path

import pytest

from helpers import ROOT

FOLDER_MARKERS = {"unit", "integration", "horovod", "slurm", "container", "bench", "compat"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        folder = Path(item.fspath).parent.name
        if folder in FOLDER_MARKERS:
            item.add_marker(getattr(pytest.mark, folder))


# A real Slurm (Debian's slurm-wlm) with 2 emulated nodes n9, n10 and fake GPUs: used by slurm/ and container/.
CLUSTER = ROOT / "tests" / "cluster"
SLURM_ROOT = os.environ.get("DISTRAIN_TEST_SLURM_ROOT", "/tmp/distrain-slurm")
SLURM_CONF = f"{SLURM_ROOT}/etc/slurm.conf"


def _running() -> bool:
    env = {**os.environ, "SLURM_CONF": SLURM_CONF}
    try:
        return "UP" in subprocess.run(["scontrol", "ping"], env=env, capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.fixture(scope="session")
def slurm():
    """Start the test cluster (idempotent); stop it afterwards only if this session started it."""
    was_running = os.path.exists(SLURM_CONF) and _running()
    env = {**os.environ, "SLURM_ROOT": SLURM_ROOT}
    out = subprocess.run([str(CLUSTER / "start-slurm.sh")], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    yield SLURM_CONF
    if not was_running:
        subprocess.run([str(CLUSTER / "stop-slurm.sh")], env=env, capture_output=True, timeout=120)
