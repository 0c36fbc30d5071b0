"""What a run is: the same command resumes, another one starts fresh; a live run's state is not shared."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from entrypoint import runs
from entrypoint.errors import ConfigError
from entrypoint.plan import detect
from helpers import Watched


def run_of(argv, **env):
    return detect({"USER": "u", **env}, gpus=[], script="/home/u/proj/train.py", argv=argv)


def test_the_same_command_is_the_same_run_and_other_arguments_another():
    first, again = run_of(["--lr", "0.01"]), run_of(["--lr", "0.01"])
    other = run_of(["--lr", "0.5"])
    assert first.checkpoint_dir == again.checkpoint_dir
    assert other.checkpoint_dir != first.checkpoint_dir
    assert first.run_name.startswith("train-") and "/runs/" in first.checkpoint_dir


def test_a_resubmitted_job_is_the_same_run_but_another_job_name_or_array_task_is_not():
    job1 = run_of(["--epochs", "9"], SLURM_JOB_ID="11", SLURM_JOB_NAME="distrain-mwm")
    job2 = run_of(["--epochs", "9"], SLURM_JOB_ID="12", SLURM_JOB_NAME="distrain-mwm")
    assert job1.checkpoint_dir == job2.checkpoint_dir  # the job id is not part of the run
    assert run_of(["--epochs", "9"], SLURM_JOB_NAME="sweep").checkpoint_dir != job1.checkpoint_dir
    tasks = {run_of([], SLURM_ARRAY_JOB_ID="5", SLURM_ARRAY_TASK_ID=str(t)).checkpoint_dir for t in range(3)}
    assert len(tasks) == 3


def test_distrain_run_names_a_run_whatever_its_arguments():
    named = run_of(["--epochs", "3"], DISTRAIN_RUN="exp 1/a")
    assert named.run_name == "exp_1_a"
    assert run_of(["--epochs", "30"], DISTRAIN_RUN="exp 1/a").checkpoint_dir == named.checkpoint_dir


def test_resume_setting():
    assert run_of([]).resume and not run_of([], DISTRAIN_RESUME="0").resume
    with pytest.raises(ConfigError, match="DISTRAIN_RESUME"):
        run_of([], DISTRAIN_RESUME="maybe")


def identity(name="a", key="k1"):
    return runs.RunIdentity(name, key, "")


def test_open_run_says_new_then_resuming_at_the_recorded_position(tmp_path):
    assert runs.open_run(str(tmp_path), identity(), 0, ["train.py"], True, False).startswith("new run a ")
    chief = tmp_path / "chief"
    chief.mkdir()
    (chief / "ckpt-3.json").write_text("{}")
    runs.write_position(str(chief / "ckpt-3"), runs.Position(2, 5))
    line = runs.open_run(str(tmp_path), identity(), 0, ["train.py"], True, False)
    assert line.startswith("resuming run a at epoch 3, step 6")  # 5 steps of epoch 3 done


def test_a_rerun_resumes_in_the_latest_fit_with_a_checkpoint_and_says_which(tmp_path):
    """A script's second fit keeps its checkpoints in fit-2/ (the first fit's are in the run dir): the first line
    names that fit, and DISTRAIN_RESUME=0 removes every fit's state."""
    assert runs.stage_dir(str(tmp_path), 1) == str(tmp_path)
    second = Path(runs.stage_dir(str(tmp_path), 2)) / "chief"
    second.mkdir(parents=True)
    (second / "ckpt-1.json").write_text("{}")
    runs.write_position(str(second / "ckpt-1"), runs.Position(1, 2))
    assert runs.resume_point(str(tmp_path)) == (2, runs.Position(1, 2))
    line = runs.open_run(str(tmp_path), identity(), 0, ["train.py"], True, False)
    assert line.startswith("resuming run a at fit 2, epoch 2, step 3 ")
    line = runs.open_run(str(tmp_path), identity(), 0, ["train.py"], False, False)
    assert line.startswith("new run a (DISTRAIN_RESUME=0") and not second.parent.exists()


def test_the_position_is_the_newest_complete_checkpoints_own(tmp_path):
    chief = tmp_path / "chief"
    chief.mkdir()
    for number, epoch, step, length in ((9, 1, 4, None), (10, 2, 0, 7)):
        (chief / f"ckpt-{number}.index").write_text("")
        runs.write_position(str(chief / f"ckpt-{number}"), runs.Position(epoch, step),
                            {"epoch_length": length} if length else None)
    assert runs.read_position(str(tmp_path)) == runs.Position(2, 0)  # 10 > 9: by number, not by name
    # unknown length: its epochs', once learnt
    assert runs.read_checkpoint_record(str(tmp_path))[1] == {"epoch_length": 7}
    (chief / "ckpt-10.index").rename(chief / "ckpt-10.index.corrupt")  # set aside as unreadable
    assert runs.read_position(str(tmp_path)) == runs.Position(1, 4)
    assert runs.read_checkpoint_record(str(tmp_path))[1] == {}
    (chief / "ckpt-11.json").write_text("{}")  # complete, but written without a position
    assert runs.read_position(str(tmp_path)) is None


def test_another_runs_state_is_refused_unless_told_to_start_over(tmp_path):
    runs.open_run(str(tmp_path), identity("a", "k1"), 0, ["train.py", "--lr", "1"], True, True)
    (tmp_path / "chief").mkdir()
    (tmp_path / "chief" / "ckpt-1.json").write_text("{}")
    with pytest.raises(ConfigError, match=r"holds the state of another run \(a: train.py --lr 1\)"):
        runs.open_run(str(tmp_path), identity("b", "k2"), 1, ["train.py"], True, True)
    line = runs.open_run(str(tmp_path), identity("b", "k2"), 0, ["train.py"], False, True)
    assert "earlier state removed" in line and not (tmp_path / "chief").exists()
    assert json.loads((tmp_path / "run.json").read_text())["key"] == "k2"


def test_a_run_held_by_a_live_process_is_refused(tmp_path):
    holder = Watched([sys.executable, "-c", "import sys, time; from entrypoint import runs; "
                      f"runs.open_run({str(tmp_path)!r}, runs.RunIdentity('a', 'k', ''), 0, [], True, False); "
                      "print('held', flush=True); time.sleep(60)"], env=dict(os.environ))
    with holder:
        holder.until("^held$", timeout=60)
        with pytest.raises(ConfigError, match="in use by pid"):
            runs.open_run(str(tmp_path), identity("a", "k"), 0, [], True, False)
        holder.kill()
    runs.open_run(str(tmp_path), identity("a", "k"), 0, [], True, False)  # free again once it is gone


def test_plan_on_the_login_node_shows_the_run_and_directory_the_job_will_have_when_told_its_job_name(tmp_path):
    """The job names the run and, with no $SCRATCH or $WORK, writes to the submit dir's distrain-output (jobs/lib.sh),
    not the login node's /tmp."""
    script = tmp_path / "proj" / "train.py"
    script.parent.mkdir()
    script.write_text("print('training')\n")
    job = detect({"USER": "u", "SLURM_JOB_NAME": "distrain-mwm"}, gpus=[], script=str(script), argv=["--epochs", "3"])
    plan = subprocess.run([sys.executable, "-m", "entrypoint", "plan", "--json", "--job-name", "distrain-mwm",
                           str(script), "--epochs", "3"], capture_output=True, text=True, cwd=tmp_path,
                          env={"PATH": "/usr/bin:/bin", "USER": "u", "HOME": str(tmp_path),
                               "PYTHONPATH": os.path.dirname(os.path.dirname(runs.__file__))}, timeout=300)
    shown = json.loads(plan.stdout)
    assert shown["run_name"] == job.run_name, plan.stdout + plan.stderr
    assert shown["checkpoint_dir"] == str(tmp_path / "distrain-output" / "runs" / job.run_name), shown
    assert shown["checkpoint_chosen_by"] == "from DISTRAIN_OUTPUT_DIR"
    on_scratch = detect({"SCRATCH": "/scratch/u", "USER": "u"}, script=None, argv=[])
    assert on_scratch.checkpoint_chosen_by == "from $SCRATCH"
    assert detect({"USER": "u"}).checkpoint_chosen_by == \
        "in this machine's /tmp: no DISTRAIN_OUTPUT_DIR, $SCRATCH or $WORK set"


def test_plan_of_a_missing_script_or_an_unknown_option_of_its_own_is_one_line_and_exit_2(tmp_path):
    """#85: `plan missing.py` exited 0, and `plan --jsn train.py` planned a run named `--jsn-...`."""
    package_root = os.path.dirname(os.path.dirname(runs.__file__))
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONPATH": package_root}
    for argv, said in ((["missing.py"], "training script 'missing.py' not found"),
                       (["--jsn", "train.py"], "no option --jsn of distrain plan")):
        out = subprocess.run([sys.executable, "-m", "entrypoint", "plan", *argv], capture_output=True, text=True,
                             cwd=tmp_path, env=env, timeout=60)
        assert out.returncode == 2 and said in out.stderr and "Traceback" not in out.stderr, out.stderr


def test_an_option_spelled_with_or_without_equals_is_one_run():
    """`--batch-size 8` and `--batch-size=8` are one run (#70: retyped in the other spelling, a resume started over);
    another value, or the same text as a positional after `--`, is another."""
    def name(*argv):
        return runs.identity({}, "train.py", list(argv)).name

    assert name("--batch-size", "8", "--lr=0.1") == name("--batch-size=8", "--lr", "0.1")
    assert name("--batch-size=8") != name("--batch-size=16")
    assert name("--", "--batch-size=8") != name("--", "--batch-size", "8")
    assert runs.spelled_alike(["-n=2", "--x=a=b", "--", "--y=1"]) == ["-n=2", "--x", "a=b", "--", "--y=1"]


def test_a_new_run_names_the_unfinished_run_of_its_script_with_other_arguments_and_distrain_run_continues_it(
        tmp_path):
    """`--epochs 50` stopped, then `--epochs 100`: another run, said in one line naming the stopped one and how to
    continue it; DISTRAIN_RUN with that name then adopts it (its checkpoints, its position)."""
    script = "/home/u/proj/train.py"
    runs_dir = tmp_path / "runs"

    def opened(argv, **env):
        plan = detect({"USER": "u", "DISTRAIN_OUTPUT_DIR": str(tmp_path), **env}, gpus=[], script=script, argv=argv)
        os.makedirs(plan.checkpoint_dir, exist_ok=True)
        identity = runs.RunIdentity(plan.run_name, plan.run_key, "")
        return plan, identity, runs.open_run(plan.checkpoint_dir, identity, 0, [script, *argv], True, False)

    fifty, fifty_identity, line = opened(["--epochs", "50"])
    assert line.startswith("new run train-")
    assert runs.unfinished_alike(fifty.checkpoint_dir, fifty_identity, script) is None
    chief = Path(fifty.checkpoint_dir) / "chief"
    chief.mkdir()
    (chief / "ckpt-4.json").write_text("{}")
    runs.write_position(str(chief / "ckpt-4"), runs.Position(2, 40))
    hundred, hundred_identity, line = opened(["--epochs", "100"])
    assert line.startswith("new run train-") and hundred.checkpoint_dir != fifty.checkpoint_dir
    said = runs.unfinished_alike(hundred.checkpoint_dir, hundred_identity, script)
    assert said == (f"run {fifty.run_name} of this script with other arguments (--epochs 50) stopped unfinished at "
                    f"epoch 3, step 41: this is a new run; to continue that one with these arguments, set "
                    f"DISTRAIN_RUN={fifty.run_name}"), said
    assert runs.unfinished_alike("/elsewhere/runs/x", hundred_identity, "/home/u/other.py") is None
    continued, _, line = opened(["--epochs", "100"], DISTRAIN_RUN=fifty.run_name)
    assert continued.checkpoint_dir == fifty.checkpoint_dir and line.startswith(
        f"resuming run {fifty.run_name} at epoch 3, step 41"), line
    assert sorted(p.name for p in runs_dir.iterdir()) == sorted({Path(fifty.checkpoint_dir).name,
                                                                 Path(hundred.checkpoint_dir).name})


def test_a_bad_checkpoint_set_aside_by_every_rank_at_once_ends_set_aside_once(tmp_path, monkeypatch):
    """On a shared filesystem each rank that finds the newest checkpoint unreadable moves it aside: a rank whose
    listing names a file another rank has just moved goes on, and nothing is set aside twice."""
    import glob

    from entrypoint.fit import checkpoint_files

    for number in (1, 2):
        for suffix in (".index", ".data-00000-of-00001", ".position"):
            (tmp_path / f"ckpt-{number}{suffix}").write_text("")
    listed, real = glob.glob(str(tmp_path / "ckpt-2.*")), glob.glob
    checkpoint_files.drop_checkpoint(str(tmp_path), str(tmp_path / "ckpt-2"))  # the first rank
    calls = iter([lambda pattern: listed])  # the second rank's listing, made before the first moved them
    monkeypatch.setattr(glob, "glob", lambda pattern, **kw: next(calls, real)(pattern, **kw))
    checkpoint_files.drop_checkpoint(str(tmp_path), str(tmp_path / "ckpt-2"))
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.glob("ckpt-2*")) == [
        "ckpt-2.data-00000-of-00001.corrupt", "ckpt-2.index.corrupt", "ckpt-2.position.corrupt"]
    assert (tmp_path / "checkpoint").read_text().startswith('model_checkpoint_path: "ckpt-1"')
    checkpoint_files.drop_checkpoint(str(tmp_path), str(tmp_path / "ckpt-2"))  # a third, later: nothing to move
    assert not list(tmp_path.glob("*.corrupt.corrupt"))
