"""Private work dirs on shared machines (workdirs): the ssh-like ownership rule, on real directories."""

import os
import stat

import pytest

from entrypoint.errors import EnvironmentProblem
from entrypoint.plan import detect
from entrypoint.workdirs import WorkDir, make_private_dirs, make_tree_private, prepare, problem, root

NOBODY = 65534


def mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_default_roots_say_where_ownership_is_checked_from():
    assert root({"USER": "u"}, "DISTRAIN_OUTPUT_DIR") == WorkDir("/tmp/u/distrain", owned_from="/tmp/u")
    assert root({"SCRATCH": "/s/u"}, "DISTRAIN_OUTPUT_DIR") == WorkDir("/s/u/distrain", owned_from="/s/u/distrain")
    assert root({"DISTRAIN_OUTPUT_DIR": "/proj/x", "SCRATCH": "/s"}, "DISTRAIN_OUTPUT_DIR") == WorkDir("/proj/x")


def test_the_plan_carries_the_checkpoint_dirs_check():
    plan = detect({"USER": "u", "SLURM_JOB_ID": "7"}, gpus=[], script="train.py")
    assert plan.checkpoint_workdir == WorkDir(f"/tmp/u/distrain/runs/{plan.run_name}", owned_from="/tmp/u")
    plan = detect({"DISTRAIN_CHECKPOINT_DIR": "/proj/ck"}, gpus=[])
    assert plan.checkpoint_workdir == WorkDir("/proj/ck")


def test_created_dirs_are_0700_all_the_way_down(tmp_path):
    target = tmp_path / "a" / "b" / "c"
    make_private_dirs(str(target))
    assert [mode(p) for p in (tmp_path / "a", tmp_path / "a" / "b", target)] == [0o700] * 3


@pytest.mark.parametrize(("owner", "bits", "why"), [
    (NOBODY, 0o700, "is owned by uid 65534"),
    (None, 0o777, "is writable by others"),
    (None, 0o770, "is writable by its group"),
])
def test_a_default_dir_that_is_not_ours_alone_is_refused(tmp_path, owner, bits, why):
    user_tmp = tmp_path / "u"
    (user_tmp / "distrain").mkdir(parents=True)
    os.chmod(user_tmp / "distrain", bits)
    if owner is not None:
        os.chown(user_tmp / "distrain", owner, -1)
    workdir = WorkDir(str(user_tmp / "distrain" / "checkpoints"), owned_from=str(user_tmp))
    assert why in problem(workdir)
    with pytest.raises(EnvironmentProblem, match="remove it, or set DISTRAIN_OUTPUT_DIR"):
        prepare(workdir)
    assert os.listdir(user_tmp / "distrain") == []  # nothing created there


def test_a_planted_symlink_is_refused(tmp_path):
    (tmp_path / "elsewhere").mkdir()
    os.symlink(tmp_path / "elsewhere", tmp_path / "u")
    assert "is a symbolic link" in problem(WorkDir(str(tmp_path / "u" / "distrain"), owned_from=str(tmp_path / "u")))


def test_a_named_dir_is_the_users_choice_and_world_writable_warns(tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    os.chmod(project, 0o770)  # group-writable project space: fine, silently
    warnings = []
    assert prepare(WorkDir(str(project / "run")), warn=warnings.append) == str(project / "run")
    assert warnings == [] and mode(project / "run") == 0o700
    os.chmod(project / "run", 0o777)
    prepare(WorkDir(str(project / "run")), warn=warnings.append)
    assert len(warnings) == 1 and "writable by every user" in warnings[0]


def test_checkpoint_files_are_made_0600(tmp_path):
    (tmp_path / "chief").mkdir()
    (tmp_path / "chief" / "ckpt-1.index").write_text("x")
    make_tree_private(str(tmp_path))
    assert mode(tmp_path / "chief") == 0o700 and mode(tmp_path / "chief" / "ckpt-1.index") == 0o600
