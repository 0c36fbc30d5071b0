"""Each test folder is a marker: unit, integration, horovod, slurm, container, bench, compat, conformance,
gpu (a real NVIDIA driver: skipped elsewhere).

scripts/test.sh runs the suite in 3 pytest-xdist workers on CI's 2 cores: much of it waits (stall timers, Slurm,
rendezvous, image builds), and the other workers fill that time. The tests that share the local Slurm, dockerd and
the images built in the session (CLUSTER_TESTS) run one after another on one worker: Slurm hands out the same fake
GPUs to all workers' jobs, and each worker would start, build and stop them for itself."""

import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import ROOT, XDIST_WORKER

FOLDER_MARKERS = {"unit", "integration", "horovod", "slurm", "container", "bench", "compat", "conformance", "gpu"}
CLUSTER_FIXTURES = {"slurm", "slurm_eight_nodes", "slurm_gres_only", "docker", "docker_image", "sif"}
CLUSTER_TESTS = ("tests/slurm/", "tests/container/",
                 "tests/compat/test_corpus.py::test_the_guides_scripts_through_the_job_scripts")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    asked_for_gpu_image = "gpu_image" in (config.option.markexpr or "")
    for item in items:
        if item.get_closest_marker("gpu_image") and not asked_for_gpu_image:
            item.add_marker(pytest.mark.skip(reason="the GPU image's build: only with -m gpu_image (several GB)"))
        folder = Path(item.fspath).parent.name
        if folder in FOLDER_MARKERS:
            item.add_marker(getattr(pytest.mark, folder))
        if CLUSTER_FIXTURES & set(getattr(item, "fixturenames", ())) and not item.nodeid.startswith(CLUSTER_TESTS):
            raise pytest.UsageError(f"{item.nodeid} uses the local Slurm or the container images: add it to "
                                    "CLUSTER_TESTS in tests/conftest.py, so it runs on their worker")


STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)


@pytest.fixture(autouse=True)
def _stop_signals_as_they_were() -> Iterator[None]:
    """A test that takes distrain's stop in this process (unit/test_agreed_stop.py: `Preempted` ignores the stop
    signals from then on, as a stopping worker must) left SIGTERM ignored in the pytest worker, and every process it
    started later inherited that (an ignored signal stays ignored across exec): a plain `python` run that sends
    itself SIGTERM, as test_exact_resume's do, trained on to the end and exited 0. Each test's changes undone."""
    before = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    yield
    for sig, handler in before.items():
        if handler is not None and signal.getsignal(sig) is not handler:
            signal.signal(sig, handler)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """xdist's default (`load`) scheduling, test by test, but CLUSTER_TESTS as one unit on one worker. Not
    xdist's own `--dist loadgroup`: with pytest 9.2 it silently stops grouping (pytest-xdist#1386)."""
    if config.getvalue("dist") != "load":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ClusterTestsOnOneWorker(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return "cluster" if nodeid.startswith(CLUSTER_TESTS) else nodeid

    return ClusterTestsOnOneWorker(config, log)


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
def kept_runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where this session keeps the runs several tests compare against (helpers.run_once): shared by the xdist
    workers (their base temp's parent is the session's)."""
    base = tmp_path_factory.getbasetemp()
    return (base.parent if XDIST_WORKER else base) / "kept-runs"


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


def another_cluster(name: str) -> Iterator[str]:
    """A cluster beside the first, with start-slurm.sh's settings in tests/cluster/NAME.env: started, its
    SLURM_CONF yielded, stopped after the tests that need it."""
    lines = (CLUSTER / f"{name}.env").read_text().splitlines()
    env = {**os.environ, **dict(line.split("=", 1) for line in lines if line and not line.startswith("#"))}
    out = subprocess.run([str(CLUSTER / "start-slurm.sh")], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    yield f"{env['SLURM_ROOT']}/etc/slurm.conf"
    subprocess.run([str(CLUSTER / "stop-slurm.sh")], env=env, capture_output=True, timeout=120)


@pytest.fixture(scope="session")
def slurm_eight_nodes():
    """A second cluster of 8 emulated nodes (8 slurmd processes: only in --full)."""
    yield from another_cluster("eight-nodes")


@pytest.fixture(scope="session")
def slurm_gres_only():
    """A cluster whose Slurm takes GPUs only as --gres=gpu:N (select/cons_res refuses --gpus-per-task)."""
    yield from another_cluster("gres-only")
