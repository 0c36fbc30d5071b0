"""What a newcomer meets first: --help everywhere, and exit codes that agree in --help, the README and lib.sh."""

import re
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from entrypoint.cli import app
from entrypoint.console import parse_launch
from helpers import DISTRAIN, ROOT, clean_env, small_tmpfs
from readme_blocks import block

COMMANDS = [["run"], ["launch"], ["plan"], ["doctor"], ["data"], ["packages"], ["bench"], ["image"], ["image", "build"],
            ["image", "pull"], []]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c) or "distrain")
def test_help_of_every_command_exits_0_and_explains(command):
    out = CliRunner().invoke(app, [*command, "--help"])
    assert out.exit_code == 0, out.output
    assert "Usage: " in out.output and "not found" not in out.output


def codes_in(text: str) -> set[int]:
    return {int(c) for c in re.findall(r"(?<![\w.-])(\d{1,3})(?![\w.%-])", text) if int(c) in range(0, 256)}


def test_exit_codes_agree_in_help_readme_and_the_job_scripts():
    help_text = CliRunner().invoke(app, ["--help"]).output
    help_codes = codes_in(help_text[help_text.index("Exit codes:"):help_text.index("Options:")])
    reference = (ROOT / "docs" / "reference.md").read_text()
    table = reference[reference.index("## Exit codes"):reference.index("## Modes")]
    readme_codes = {int(c) for row in re.findall(r"^\| ([^|]+?) \|", table, re.MULTILINE)
                    for c in re.findall(r"\d+", row)}
    lib = (ROOT / "jobs" / "lib.sh").read_text()
    lib_codes = codes_in(lib[lib.index("# Exit codes"):lib.index("\n\n", lib.index("# Exit codes"))])
    assert help_codes == readme_codes == {0, 1, 2, 3, 4, 5, 75, 130, 137, 143}, (help_codes, readme_codes)
    assert lib_codes <= readme_codes and {0, 1, 2, 3, 4, 75} <= lib_codes, lib_codes


def test_the_readme_opens_for_users_and_closes_with_the_developers_commands():
    readme = (ROOT / "README.md").read_text()
    headers = re.findall(r"^## (.+)$", readme, re.MULTILINE)
    assert headers[:4] == ["Quick start on Slurm, with the image", "Quick start on Slurm, without an image",
                           "One machine with Docker", "Worked example: 2 nodes x 4 GPUs, 20 hours"] and \
        headers[-1] == "Develop", headers
    develop = readme[readme.index("## Develop"):]
    assert "scripts/install.sh" in develop and "scripts/test.sh" in develop
    assert (ROOT / ".ci" / "run").read_text().strip().endswith("exec scripts/test.sh")
    assert "sbatch" in block("quickstart-slurm") and "docker run" in block("quickstart-docker")


def test_doctor_warns_when_shared_memory_is_too_small_for_several_gpus(tmp_path):
    from entrypoint.tools.hostcheck import shared_memory

    with small_tmpfs(tmp_path / "shm", "64m") as docker_default:  # what Docker gives without --shm-size
        line, warning = shared_memory(gpus=2, path=str(docker_default))
        assert line.endswith(" 64 MiB") and "--shm-size=1g" in warning
        assert shared_memory(gpus=1, path=str(docker_default))[1] is None  # one GPU: NCCL needs none
    line, warning = shared_memory(gpus=2, path=str(tmp_path / "absent"))
    assert warning and "unavailable" in warning
    assert shared_memory(gpus=1, path=str(tmp_path / "absent"))[1] is None


ENTRY = """import sys
from entrypoint.console import main
try:
    main()
except SystemExit as e:
    print(e.code, 'typer' in sys.modules)"""


@pytest.mark.parametrize("argv", [["run", "missing.py"], ["missing.py"],
                                  ["launch", "-n", "2", "--port=7000", "missing.py"]])
def test_the_commands_every_job_runs_start_without_typer(tmp_path, argv):
    """`run` (every worker) and `launch` are parsed without typer: it costs ~35 ms of CPU per process (#21)."""
    out = subprocess.run([sys.executable, "-c", ENTRY, *argv], cwd=tmp_path, capture_output=True, text=True,
                         timeout=300)
    assert out.stdout.split() == ["2", "False"], out
    assert out.stderr == f"distrain: error: training script 'missing.py' not found (relative to {tmp_path}): " \
                         "check the path and bind mounts\n"


def test_everything_else_still_goes_through_typer(tmp_path):
    out = subprocess.run([sys.executable, "-c", ENTRY, "launch", "--help"], cwd=tmp_path, capture_output=True,
                         text=True, timeout=300)
    assert "Usage: distrain launch" in out.stdout and out.stdout.split()[-2:] == ["0", "True"], out


def test_launch_options_are_parsed_as_typer_would_or_left_to_typer():
    assert parse_launch(["-n", "3", "--port", "7000", "t.py", "--epochs", "2", "-n", "9"]) == (
        {"workers": 3, "port": 7000}, "t.py", ["--epochs", "2", "-n", "9"])
    assert parse_launch(["--workers=4", "bench", "--steps", "5"]) == ({"workers": 4}, "bench", ["--steps", "5"])
    for typer_reports_it in (["--help"], ["-n", "x", "t.py"], ["-n", "2"], ["--port"], [], ["-n3", "t.py"],
                             ["-n=3", "t.py"]):
        assert parse_launch(typer_reports_it) is None, typer_reports_it


def test_a_mistyped_command_is_not_taken_for_a_script(tmp_path):
    out = subprocess.run([sys.executable, "-m", "entrypoint", "runz"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert "distrain: error: no command or script 'runz' (commands: run, launch, plan," in out.stderr


def test_a_script_that_does_not_compile_is_one_line_before_any_run_starts(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("import numpy\n\nfor epoch in range(3)\n    print(epoch)\n")
    for command in (["run"], ["launch", "-n", "2"]):
        out = subprocess.run([sys.executable, "-m", "entrypoint", *command, str(script)], cwd=tmp_path, text=True,
                             capture_output=True, env=clean_env(DISTRAIN_OUTPUT_DIR=str(tmp_path / "o")), timeout=300)
        assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
        assert f"distrain: error: {script}:3: expected ':'" in out.stderr and "Traceback" not in out.stderr
    assert not (tmp_path / "o").exists()  # no run state written, TensorFlow never loaded


@pytest.mark.parametrize("job", ["mwm.job", "selftest.job"])
def test_a_job_script_run_by_hand_outside_slurm_says_to_submit_it_and_writes_nothing(tmp_path, job):
    out = subprocess.run(["bash", str(ROOT / "jobs" / job), "train.py"], cwd=tmp_path, capture_output=True,
                         text=True, env=clean_env(), timeout=300)
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert "this is a Slurm job script: submit it with sbatch" in out.stderr and not list(tmp_path.iterdir())


def test_the_console_knows_every_command_the_cli_has():
    """A command left out of console.COMMANDS would be taken for a script name."""
    from entrypoint.cli import app
    from entrypoint.console import COMMANDS, HIDDEN_COMMANDS

    cli = {c.name or c.callback.__name__ for c in app.registered_commands} | {g.name for g in app.registered_groups}
    assert cli == {c for c in COMMANDS if not c.startswith("-")} | set(HIDDEN_COMMANDS), cli


def test_launch_without_n_starts_nothing_and_says_what_it_needs(tmp_path):
    (tmp_path / "train.py").write_text("print('trained')\n")
    for argv in (["launch", "train.py"], ["launch", "--port", "3000", "train.py"]):
        out = subprocess.run([DISTRAIN, *argv], cwd=tmp_path, capture_output=True, text=True, timeout=60)
        assert out.returncode == 2 and "trained" not in out.stdout, out
        assert out.stderr.strip().splitlines() == ["distrain: error: distrain launch needs -n N, the number of local "
                                                   "workers to start: distrain launch -n 2 train.py"], out.stderr
