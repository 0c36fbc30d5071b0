"""`distrain plan --job-name` on the login node: what the job file of that name will run, with its header's
nodes and tasks or the ones given as sbatch would be given them; a name of no job file is said to be unknowable."""

import json
import subprocess

from entrypoint import job_files
from helpers import DISTRAIN, ROOT, clean_env


def test_the_job_files_shape_from_its_header_and_the_options_given():
    mwm = job_files.job_shape("distrain-mwm", str(ROOT))
    assert (mwm.job_file, mwm.mode, mwm.nodes, mwm.tasks_per_node, mwm.ranks) == ("jobs/mwm.job", "mwm", 2, 4, 8)
    given = job_files.job_shape("distrain-horovod", str(ROOT), nodes=3, tasks_per_node=2)
    assert (given.mode, given.ranks) == ("horovod", 6)
    single = job_files.job_shape("distrain-single", str(ROOT))
    assert single.ranks == 1 and "one process on one GPU" in single.line()
    unknown = job_files.job_shape("myexp", str(ROOT))
    assert isinstance(unknown, str) and "cannot be known here" in unknown and "distrain-mwm" in unknown
    assert "trains nothing" in job_files.job_shape("distrain-venv-build", str(ROOT))


def test_plan_with_a_job_name_says_the_jobs_mode_and_ranks_first(tmp_path):
    env = clean_env(DISTRAIN_OUTPUT_DIR=str(tmp_path))
    text = subprocess.run([DISTRAIN, "plan", "--job-name", "distrain-mwm", "--nodes", "3"], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=60).stdout
    assert text.splitlines()[0].startswith("job distrain-mwm (jobs/mwm.job): mode mwm, 3 node(s) x 4 task(s) = "
                                           "12 ranks"), text
    data = json.loads(subprocess.run([DISTRAIN, "plan", "--json", "--job-name", "distrain-mwm"], env=env,
                                     cwd=tmp_path, capture_output=True, text=True, timeout=60).stdout)
    assert data["job"]["ranks"] == 8 and data["mode"] == "single"  # the login node's own row, said as such
