"""A newcomer without an admin and without an image, as an ordinary account (TEST_USER: no root anywhere in the
path; scripts/install.sh makes it), runs the README's blocks in order: get distrain (its own copy: what the
README's clone brings), the quick start without an image (a virtualenv with distrain and TensorFlow from PyPI,
`jobs/mwm.job` with USE_CONTAINER=0 on the local Slurm's two nodes, stopped by a signal, requeued, resumed), then
the worked example (its packages built on the login node with `$DISTRAIN/bin/distrain`, DISTRAIN_RUN), in the
same shell's variables. The blocks that need an image, a release, Docker or a GPU are the ones left out."""

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

import slurm_jobs
from entrypoint import __version__
from helpers import (
    ROOT,
    TEST_USER,
    USERS_PIP_CACHE,
    account_exists,
    as_the_user,
    assert_trained_in_sync,
    copy_of_the_checkout,
    the_users_own,
)
from readme_blocks import block
from slurm_jobs import cancel, submitted, wait_for_text, wait_gone


def job_log(slurm: str, project: Path, out: subprocess.CompletedProcess, stop_after: str | None = None) -> str:
    """The log of the job `out` submitted, once it is gone; signalled (SIGTERM to its steps) at `stop_after`."""
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    job_id = submitted(out)
    log = project / f"distrain-mwm-{job_id}.out"
    try:
        if stop_after:
            wait_for_text(log, stop_after, timeout=300)
            subprocess.run(["scancel", "--signal=TERM", job_id], env={**os.environ, "SLURM_CONF": slurm},
                           check=True, timeout=60)
        wait_gone(slurm, job_id, timeout=420)  # requeued by the job file's header: it resumes by itself
    finally:
        cancel(slurm, job_id)
    return f"job {job_id}\n" + log.read_text(errors="replace")


@pytest.mark.skipif(not account_exists(), reason=f"no account {TEST_USER}: scripts/install.sh makes it")
def test_a_newcomer_runs_the_readmes_blocks_in_order_as_an_ordinary_user(slurm):
    home = Path(f"~{TEST_USER}").expanduser()
    work = home / f"newcomer-{os.getpid()}-{int(time.time())}"
    distrain = work / "distrain"
    copy_of_the_checkout(distrain)
    myproject, unet = work / "myproject", work / "unet"
    for project in (myproject, unet):
        project.mkdir()
        shutil.copy(ROOT / "examples" / "train.py", project / "train.py")
    slurm_jobs.with_the_labs_package(unet)  # its requirements.txt: the lab's wheel, no index (rasterio's place)
    (work / "scratch" / "tiles").mkdir(parents=True)  # the worked example's data directory
    USERS_PIP_CACHE.mkdir(parents=True, exist_ok=True)
    the_users_own(USERS_PIP_CACHE)
    the_users_own(work)
    env = {"HOME": str(home), "USER": TEST_USER, "PATH": f"{home}/.local/bin:/usr/local/bin:/usr/bin:/bin",
           "LANG": "C.UTF-8", "DISTRAIN": str(distrain), "SCRATCH": str(work / "scratch"), "SLURM_CONF": slurm,
           "USERS_PIP_CACHE_DIR": str(USERS_PIP_CACHE), "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    shutil.rmtree(home / ".local", ignore_errors=True)  # a newcomer: no distrain command yet (a killed run's)
    try:
        # 1. get distrain: every line as written but the clone (the copy above is it)
        lines = [line for line in block("get-distrain").splitlines() if "git clone " not in line]
        out = as_the_user("\n".join(lines), work, env, timeout=600)
        assert out.returncode == 0 and out.stdout.strip().endswith(f"distrain {__version__}"), out.stdout + out.stderr
        # 2. the quick start without an image, as written but for a GPU-less machine (tensorflow-cpu) and epochs
        # long enough to be stopped in
        command = block("quickstart-venv").replace('"tensorflow[and-cuda]==', '"tensorflow-cpu==') \
            .replace("--epochs 3", "--epochs 12 --batch-size 8").replace("cd ~/myproject", f"cd {myproject}")
        assert command.count("tensorflow-cpu==") == 1 and "--batch-size 8" in command
        text = job_log(slurm, myproject, as_the_user(command, work, env, timeout=900), stop_after="Epoch 2/")
        assert "mwm on 2 worker(s)" in text and f"{distrain}/.venv" not in text, text[-3000:]
        assert "stopped on SIGTERM after saving a checkpoint" in text and "requeueing job " in text, text[-3000:]
        assert_trained_in_sync(text[text.index("resumed from checkpoint"):], workers=2)
        # 3. the worked example, in the same shell (USE_CONTAINER=0 and DISTRAIN_VENV exported by step 2), as
        # written but for this machine's size: 1 task per node for 4, 2 epochs for 200
        env.update(USE_CONTAINER="0", DISTRAIN_VENV=f"{work}/scratch/venvs/distrain")
        command = block("worked-example").replace("--ntasks-per-node=4", "--ntasks-per-node=1") \
            .replace("--epochs 200", "--epochs 2").replace("cd ~/unet", f"cd {unet}")
        assert command.count("--ntasks-per-node=1") == 1 and command.count("--epochs 2") == 1
        out = as_the_user(command, work, env, timeout=600)
        assert "distrain: packages ready: " in out.stdout, out.stdout[-3000:] + out.stderr[-3000:]
        text = job_log(slurm, unet, out)
        assert "distrain: new run unet-2x4 (" in text and "named by DISTRAIN_RUN" in text, text[-3000:]
        assert text.count("labtools 42") == 2 and "distrain: installing " not in text, text[-3000:]  # built before
        assert_trained_in_sync(text, workers=2)
        uid = int(subprocess.check_output(["id", "-u", TEST_USER], text=True, timeout=10))
        made = [*(work / "scratch").rglob("*"), *myproject.glob("distrain-*"), *unet.glob("distrain-*"),
                *(home / ".local").rglob("*")]
        assert not [str(path) for path in made if path.lstat().st_uid != uid]  # the user's path made it all
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(home / ".local", ignore_errors=True)
