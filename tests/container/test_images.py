"""The Dockerfile and Apptainer.def, built for real and run as users run them."""

import json
import os
import re
import shutil
import subprocess
import tarfile

import pytest

from container_fixtures import DOCKER, REGISTRY, sh
from helpers import ROOT, assert_trained_in_sync, clean_env
from readme_blocks import block
from slurm_jobs import quick_start_trained, run_quick_start, submit, user, with_the_labs_package

TRAIN = ["examples/train.py", "--epochs", "2"]


def test_docker_run_trains_the_example(docker_image):
    out = sh([DOCKER, "run", "--rm", "-e", "DISTRAIN_REQUIRE_GPU=0", "-v", f"{ROOT}/examples:/workspace/examples:ro",
              docker_image, *TRAIN])
    assert out.returncode == 0, out.stdout[-3000:]
    assert_trained_in_sync(out.stdout, workers=1)


def test_docker_image_requires_a_gpu_by_default_and_says_how(docker_image):
    out = sh([DOCKER, "run", "--rm", "-v", f"{ROOT}/examples:/workspace/examples:ro", docker_image, *TRAIN])
    assert out.returncode == 3 and "--gpus all" in out.stdout and "Traceback" not in out.stdout


def test_docker_plan_and_non_root_user(docker_image):
    out = sh([DOCKER, "run", "--rm", docker_image, "plan", "--json"])
    assert out.returncode == 0 and '"mode": "single"' in out.stdout
    assert sh([DOCKER, "run", "--rm", "--entrypoint", "id", docker_image, "-u"]).stdout.strip() == "1000"
    labels = sh([DOCKER, "inspect", "-f", "{{json .Config.Labels}}", docker_image]).stdout
    assert '"org.opencontainers.image.version":"0.1.0"' in labels


def test_apptainer_run_trains_the_example(sif):
    out = sh(["apptainer", "run", "--nv", "--env", "DISTRAIN_REQUIRE_GPU=0", str(sif), *TRAIN])
    assert out.returncode == 0, out.stdout[-3000:]
    assert_trained_in_sync(out.stdout, workers=1)


def test_apptainer_without_gpu_points_at_nv(sif):
    out = sh(["apptainer", "run", str(sif), *TRAIN])
    assert out.returncode == 3 and "apptainer run --nv" in out.stdout


def test_apptainer_plan_test_and_labels(sif):
    assert "mode" in sh(["apptainer", "run", str(sif), "plan"]).stdout
    tested = sh(["apptainer", "test", str(sif)])
    assert tested.returncode == 0, tested.stdout[-2000:]
    assert "horovod: 0.28.1" in tested.stdout and "no problems found" in tested.stdout
    # %test ends with `distrain selftest`: every mode trained in the image, the GPU rows skipped with their reason
    assert re.search(r"^verdict: PASS \(\d+ passed, \d+ skipped\)$", tested.stdout, re.MULTILINE), tested.stdout
    rows = {m[1]: (m[2], m[3]) for m in re.finditer(r"^(\S.*?)\s+(pass|skip|fail)\s+\d+s\s+(.*)$", tested.stdout,
                                                     re.MULTILINE)}
    assert all(rows[check][0] == "pass" for check in ("single", "MWM x2", "Horovod x2", "MWM x2 = one process",
                                                      "Horovod x2 = one process")), rows
    assert "weights identical" in rows["MWM x2"][1] and "ring collectives" in rows["MWM x2"][1], rows
    assert "collective: Horovod with mpi" in rows["Horovod x2"][1], rows  # the image starts it with mpirun
    for check in ("GPU: mixed float16", "GPU: XLA", "GPU pinning", "driver"):
        assert rows[check][0] == "skip" and rows[check][1], rows  # skipped, with the reason
    assert "org.opencontainers.image.version: 0.1.0" in sh(["apptainer", "inspect", str(sif)]).stdout


def test_srun_apptainer_mwm_two_tasks(sif, slurm, tmp_path):
    env = {"USE_CONTAINER": "1", "DISTRAIN_IMAGE": str(sif), "APPTAINERENV_DISTRAIN_REQUIRE_GPU": "0",
           "APPTAINER_DROP_CAPS": "CAP_SYS_RESOURCE",
           "PATH": f"/opt/distrain-apptainer/bin:{clean_env()['PATH']}"}
    job = submit(slurm, tmp_path, "mwm", ["--cpus-per-task=1", "--time=10", "--nodes=2", "--ntasks-per-node=1",
                                          "--gres=gpu:1"], ["--epochs", "2"], **env)
    assert job.code == 0, job
    assert "apptainer run --nv --bind" in job.log and "mwm on 2 worker(s)" in job.log
    assert_trained_in_sync(job.log, workers=2)


@pytest.fixture(scope="module")
def tiny_image(docker, tmp_path_factory):
    """A small image in the local registry, so the pull test measures the pull, not a 2 GB squash."""
    root = tmp_path_factory.mktemp("tiny")
    tar = root / "tiny.tar"
    with tarfile.open(tar, "w") as archive:
        archive.add("/bin/true", arcname="bin/true")
        for lib in ("/lib/x86_64-linux-gnu/libc.so.6", "/lib64/ld-linux-x86-64.so.2"):
            archive.add(os.path.realpath(lib), arcname=lib.lstrip("/"))
    remote = f"{REGISTRY}/distrain-tiny:1"
    assert sh([DOCKER, "import", str(tar), remote]).returncode == 0
    assert sh([DOCKER, "push", "-q", remote]).returncode == 0
    return remote


def test_image_pull_keeps_the_cache_out_of_home(tiny_image, tmp_path):
    home, cache = tmp_path / "home", tmp_path / "scratch"
    home.mkdir()
    out = sh([str(ROOT / ".venv/bin/distrain"), "image", "pull", f"docker://{tiny_image}", str(tmp_path / "t.sif")],
             HOME=str(home), DISTRAIN_CACHE=str(cache))
    assert out.returncode == 0, out.stdout[-3000:]
    assert (tmp_path / "t.sif").is_file()
    assert any((cache / "apptainer" / "cache").rglob("*")), "nothing was cached in the relocated cache dir"
    assert list(home.iterdir()) == [], f"apptainer wrote into $HOME: {list(home.rglob('*'))}"


def test_image_pull_refuses_a_cache_under_home(tmp_path):
    out = sh([str(ROOT / ".venv/bin/distrain"), "image", "pull", "docker://x/y", str(tmp_path / "t.sif")],
             HOME=str(tmp_path), DISTRAIN_CACHE=str(tmp_path / "cache"))
    assert out.returncode == 2 and "under $HOME" in out.stdout and "--allow-home" in out.stdout


def test_failed_build_keeps_the_old_image_and_exits_5(tmp_path):
    target = tmp_path / "old.sif"
    target.write_bytes(b"previous image")
    broken = tmp_path / "broken.def"
    broken.write_text("Bootstrap: docker\nFrom: 127.0.0.1:5000/does-not-exist:1\n")
    out = sh([str(ROOT / ".venv/bin/distrain"), "image", "build", str(target), "--def", str(broken)],
             DISTRAIN_CACHE=str(tmp_path / "cache"))
    assert out.returncode == 5, out.stdout[-2000:]
    assert "apptainer build failed" in out.stdout
    assert target.read_bytes() == b"previous image"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["broken.def", "cache", "old.sif"]


def test_no_apptainer_is_a_clear_error(tmp_path):
    out = subprocess.run([str(ROOT / ".venv/bin/distrain"), "image", "pull", "docker://x/y", str(tmp_path / "t.sif")],
                         env=clean_env(PATH="/usr/bin:/bin", DISTRAIN_CACHE=str(tmp_path)), text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=ROOT, timeout=300)
    assert out.returncode == 3 and "neither apptainer nor singularity is on PATH" in out.stdout


def test_dockerfile_and_def_describe_the_same_image():
    """Field by field through spython's parsers (their converters are lossy, so no round trip)."""
    from spython.main.parse.parsers import DockerParser, SingularityParser

    docker = DockerParser(str(ROOT / "Dockerfile")).recipe["spython-base"]
    apptainer = SingularityParser(str(ROOT / "Apptainer.def")).recipe["spython-base"]
    definition = (ROOT / "Apptainer.def").read_text()
    arguments = dict(re.findall(r"^\s+(\w+)=(\S+)$", definition.split("%arguments", 1)[1].split("\n%", 1)[0], re.M))
    assert docker.fromHeader == arguments["BASE_IMAGE"]
    assert apptainer.fromHeader.lower() == "{{ base_image }}"
    # the same variables; Apptainer's runscript unsets PYTHONNOUSERSITE where DISTRAIN_USER_SITE=1 asks for ~/.local
    assert sorted(docker.environ) == sorted(apptainer.environ) == ["DISTRAIN_REQUIRE_GPU=1", "PYTHONNOUSERSITE=1"]
    runscript = definition.split("%runscript", 1)[1].split("\n%", 1)[0].strip()
    assert docker.entrypoint == ["distrain"] and runscript.endswith('exec distrain "$@"'), runscript
    docker_files = {os.path.join(dst, os.path.basename(src)) if dst.endswith("/") else dst
                    for src, dst in docker.files}
    assert docker_files == {line.split()[-1] for line in apptainer.files}  # the last word: {{ WHEELHOUSE }} has spaces
    dockerfile = (ROOT / "Dockerfile").read_text()
    # one copy of the install steps (image/install.sh), run with the same flavour, ngc by default
    assert 'RUN sh /opt/distrain/image/install.sh "${FLAVOUR}"' in dockerfile and "ARG FLAVOUR=ngc" in dockerfile
    assert 'sh /opt/distrain/image/install.sh "{{ FLAVOUR }}"' in definition and arguments["FLAVOUR"] == "ngc"
    for key in ("org.opencontainers.image.version", "org.opencontainers.image.source"):
        assert key in dockerfile and key in definition


def test_linters_pass_on_dockerfile_and_def_sections(tmp_path):
    venv = ROOT / ".venv" / "bin"
    assert subprocess.run([str(venv / "hadolint"), str(ROOT / "Dockerfile")], timeout=300).returncode == 0
    definition = (ROOT / "Apptainer.def").read_text()
    for section in ("post", "runscript", "test", "environment"):
        body = re.search(rf"^%{section}\n(.*?)(?=^%|\Z)", definition, re.M | re.S).group(1)
        script = tmp_path / f"{section}.sh"
        script.write_text("#!/bin/sh\n" + body)
        result = subprocess.run([str(venv / "shellcheck"), str(script)], capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, f"%{section}:\n{result.stdout}"


def docker_quick_start(image: str) -> str:
    """The README's Docker block, with the two things this GPU-less test machine must change: no `--gpus all`
    (no NVIDIA runtime here; the image is told not to require a GPU instead) and the test image's tag."""
    command = block("quickstart-docker")
    assert "--gpus all " in command and " distrain train.py" in command
    return command.replace("--gpus all ", "-e DISTRAIN_REQUIRE_GPU=0 ").replace(" distrain train.py",
                                                                                f" {image} train.py")


def test_the_readme_docker_block_trains_the_users_project_and_keeps_outputs_on_the_host(docker_image, tmp_path):
    home = tmp_path / "home"
    (home / "myproject").mkdir(parents=True)
    shutil.copy(ROOT / "examples" / "train.py", home / "myproject" / "train.py")
    out = sh(["bash", "-euc", docker_quick_start(docker_image)], HOME=str(home))
    assert out.returncode == 0, out.stdout[-3000:]
    assert_trained_in_sync(out.stdout, workers=1)
    runs = home / "myproject" / "distrain-output" / "runs"
    assert [p.name.split("-")[0] for p in runs.iterdir()] == ["train"], out.stdout[-2000:]


def test_docker_as_any_user_writes_outputs_as_that_user(docker_image, tmp_path):
    """`--user` with a uid the image has never heard of (no passwd entry, no home): outputs land, owned by it."""
    project = tmp_path / "project"
    project.mkdir()
    shutil.copy(ROOT / "examples" / "train.py", project / "train.py")
    os.chown(project, 4321, 4321)
    out = sh([DOCKER, "run", "--rm", "-e", "DISTRAIN_REQUIRE_GPU=0", "--user", "4321:4321", "-v",
              f"{project}:/workspace", "-e", "DISTRAIN_OUTPUT_DIR=/workspace/distrain-output", docker_image,
              "train.py", "--epochs", "1", "--save", "model.keras"])
    assert out.returncode == 0, out.stdout[-3000:]
    assert (project / "model.keras").stat().st_uid == 4321
    assert (project / "distrain-output").stat().st_uid == 4321


def test_the_quick_start_on_slurm_with_the_image(sif, slurm, tmp_path):
    """The walk-through of a user on Slurm, in the image: their own package (a local wheel named by their
    requirements.txt, installed in the image's Python), their data bound, a `pip install --user` NumPy in their
    ~/.local that the image does not read (PYTHONNOUSERSITE, Apptainer.def's %environment: read, it would fail
    the import), and `distrain runs` on the login node through the image."""
    home, project, env = user(slurm, tmp_path, USE_CONTAINER="1", DISTRAIN_IMAGE=str(sif),
                              APPTAINERENV_DISTRAIN_REQUIRE_GPU="0", APPTAINER_DROP_CAPS="CAP_SYS_RESOURCE",
                              APPTAINER_HOME=str(tmp_path / "home"))  # --home: the user's, as their passwd says
    env["PATH"] = f"/opt/distrain-apptainer/bin:{env['PATH']}"
    with_the_labs_package(project)
    for minor in range(8, 15):  # whatever Python the base has
        numpy = home / ".local" / "lib" / f"python3.{minor}" / "site-packages" / "numpy"
        numpy.mkdir(parents=True)
        (numpy / "__init__.py").write_text("raise ImportError('the user site was read')\n")
    log = run_quick_start(slurm, home, project, env)
    assert "apptainer run --nv --bind" in log and f"{tmp_path}/scratch/data" in log  # the quick start's data bound
    quick_start_trained(log, tmp_path / "scratch")
    assert log.count("labtools 42") == 2 and "the user site was read" not in log, log[-3000:]
    # on the login node, nothing installed: bin/distrain is the image's distrain (README, Quick start)
    listed = subprocess.run([str(ROOT / "bin" / "distrain"), "runs", "--json"], cwd=project, env=env, text=True,
                            capture_output=True, timeout=120)
    assert listed.returncode == 0, listed.stdout + listed.stderr
    assert [r["state"].split()[0] for r in json.loads(listed.stdout)] == ["finished"], listed.stdout
    # negative control: where the user asks for their ~/.local (DISTRAIN_USER_SITE=1: the image's runscript; in
    # %environment it was never seen, Apptainer sets the host's variables after it), the planted NumPy is imported
    (project / "imports_numpy.py").write_text("import numpy\n")
    read = subprocess.run(["apptainer", "run", str(sif), "imports_numpy.py"], text=True, capture_output=True,
                          timeout=120, cwd=project, env={**env, "DISTRAIN_USER_SITE": "1"})
    assert read.returncode != 0 and "the user site was read" in read.stdout + read.stderr, read.stdout + read.stderr
