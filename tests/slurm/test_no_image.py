"""The README's path without an image and without an admin, as an ordinary account types it: no root anywhere in
its path (scripts/install.sh makes the account, TEST_USER). Its own copy of distrain (the README's clone), its
virtualenv with distrain and TensorFlow from PyPI (tensorflow-cpu here: no GPU), the job file with
USE_CONTAINER=0, MWM on the local Slurm's two nodes; stopped mid-run by a signal, requeued, resumed."""

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from helpers import ROOT, TEST_USER, account_exists, as_the_user, assert_trained_in_sync
from readme_blocks import block
from slurm_jobs import cancel, submitted, wait_for_text, wait_gone

PIP_CACHE = Path("/var/cache/distrain") / f"pip-{TEST_USER}"  # the account's pip cache, kept between runs
# what `git clone` of the README brings: the tracked files (this test copies them, as the account cannot clone a
# repository another user owns without git's safe.directory)
NOT_CLONED = (".git", ".venv", ".venv-tf221", "__pycache__", ".pytest_cache", ".ruff_cache", "build", ".tools")


@pytest.mark.skipif(not account_exists(), reason=f"no account {TEST_USER}: scripts/install.sh makes it")
def test_the_path_without_an_image_trains_on_two_nodes_and_resumes_as_an_ordinary_user(slurm, tmp_path):
    home = Path(f"~{TEST_USER}").expanduser()
    work = home / f"no-image-{os.getpid()}-{int(time.time())}"
    distrain = work / "distrain"
    shutil.copytree(ROOT, distrain, ignore=shutil.ignore_patterns(*NOT_CLONED))
    project = work / "myproject"
    project.mkdir()
    shutil.copy(ROOT / "examples" / "train.py", project / "train.py")
    PIP_CACHE.mkdir(parents=True, exist_ok=True)
    subprocess.run(["chown", "-R", f"{TEST_USER}:", str(work), str(PIP_CACHE)], check=True, timeout=60)
    env = {"HOME": str(home), "USER": TEST_USER, "PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8",
           "DISTRAIN": str(distrain), "SCRATCH": str(work / "scratch"), "SLURM_CONF": slurm,
           "PIP_CACHE_DIR": str(PIP_CACHE), "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    # as written, but for a GPU-less machine (tensorflow-cpu) and epochs long enough to be stopped in
    command = block("quickstart-venv").replace('"tensorflow[and-cuda]==', '"tensorflow-cpu==') \
        .replace("--epochs 3", "--epochs 12 --batch-size 8").replace("cd ~/myproject", f"cd {project}")
    assert command.count("tensorflow-cpu==") == 1 and "--batch-size 8" in command
    try:
        out = as_the_user(command, work, env, timeout=900)
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
        job_id = submitted(out)
        log = project / f"distrain-mwm-{job_id}.out"
        try:
            wait_for_text(log, "Epoch 2/", timeout=300)
            subprocess.run(["scancel", "--signal=TERM", job_id], env={**os.environ, "SLURM_CONF": slurm},
                           check=True, timeout=60)
            wait_gone(slurm, job_id, timeout=420)  # requeued by the job file's header: it resumes by itself
        finally:
            cancel(slurm, job_id)
        text = log.read_text(errors="replace")
        assert "mwm on 2 worker(s)" in text and f"{distrain}/.venv" not in text, text[-3000:]
        assert "stopped on SIGTERM after saving a checkpoint" in text and f"requeueing job {job_id}" in text, \
            text[-3000:]
        resumed = text[text.index("resumed from checkpoint"):]
        assert_trained_in_sync(resumed, workers=2)
        uid = int(subprocess.check_output(["id", "-u", TEST_USER], text=True, timeout=10))
        others = [str(path) for path in [log, *(work / "scratch").rglob("*")] if path.lstat().st_uid != uid]
        assert not others, others  # everything the user's path made is the user's: nothing made as root
    finally:
        shutil.rmtree(work, ignore_errors=True)
