"""Build and pull Apptainer images through spython, with the caches kept out of $HOME.

spython (0.3.14) drives the builds; distrain wraps its sharp edges:
- it only runs a binary named `singularity`: a shim directory provides that name for `apptainer`;
- its streaming reads one of stdout/stderr and leaves the other in an unread pipe (a chatty build can block on
  it): the shim merges both into the stream spython reads;
- with no binary it raises a bare FileNotFoundError, `build()` defaults to sudo, and it returns the image path
  even when the command failed over an existing file: distrain finds the binary itself, never uses sudo,
  builds to a temporary path that replaces the target only after success, and turns failures into exit codes.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path

from .. import workdirs
from ..errors import EXIT_BUILD_FAILED, ConfigError, DistrainError, EnvironmentProblem
from ..workdirs import WorkDir

CACHE_VARS = {"APPTAINER_CACHEDIR": "cache", "APPTAINER_TMPDIR": "tmp", "APPTAINER_CONFIGDIR": "config"}
# The image's flavours (Apptainer.def's FLAVOUR, image/install.sh) and the base each is built on by default:
# ngc keeps NVIDIA's TensorFlow (2.17, the last NGC release); pypi installs TensorFlow 2.21 with PyPI's CUDA on a
# plain Debian 12, from a wheelhouse filled on the host (scripts/gpu-wheelhouse.sh).
FLAVOUR_BASES = {"ngc": "nvcr.io/nvidia/tensorflow:25.02-tf2-py3", "pypi": "docker.io/library/debian:12"}


def cache_root(env: Mapping[str, str]) -> WorkDir:
    """First of $DISTRAIN_CACHE, $SCRATCH/distrain, $WORK/distrain, /tmp/$USER/distrain."""
    return workdirs.root(env, "DISTRAIN_CACHE")


def _under(path: str, parent: str) -> bool:
    path, parent = os.path.realpath(path), os.path.realpath(parent)
    return path == parent or path.startswith(parent.rstrip("/") + "/")


def cache_workdirs(env: Mapping[str, str]) -> dict[str, WorkDir]:
    """Apptainer's cache, temp and config dirs: the user's APPTAINER_* if set, else private ones under the root."""
    root = cache_root(env).below("apptainer")
    return {var: WorkDir(env[var]) if env.get(var) else root.below(sub) for var, sub in CACHE_VARS.items()}


def cache_dirs(env: Mapping[str, str], allow_home: bool = False) -> tuple[dict[str, str], str]:
    """Where Apptainer's cache, temp and config dirs will be; refuse $HOME unless allowed."""
    dirs = {var: workdir.path for var, workdir in cache_workdirs(env).items()}
    home = env.get("HOME")
    in_home = [var for var, path in dirs.items() if home and home != "/" and _under(path, home)]
    if in_home and not allow_home:
        raise ConfigError(
            f"{', '.join(in_home)} would be under $HOME ({home}), where image layers fill home quotas: set "
            "DISTRAIN_CACHE (or SCRATCH) to a scratch directory, or pass --allow-home"
        )
    note = "set by you" if any(env.get(v) for v in CACHE_VARS) else f"under {cache_root(env).path}"
    return dirs, note


def find_apptainer(env: Mapping[str, str]) -> str:
    for name in ("apptainer", "singularity"):
        found = shutil.which(name, path=env.get("PATH"))
        if found:
            return found
    raise EnvironmentProblem(
        "neither apptainer nor singularity is on PATH: load the site's module (e.g. `module load apptainer`) "
        "or install Apptainer (scripts/setup-apptainer.sh on Debian)"
    )


@contextlib.contextmanager
def _apptainer_env(env: Mapping[str, str], allow_home: bool, merge_into: str) -> Iterator[dict[str, str]]:
    """Make spython run `apptainer` (as `singularity`) with the relocated caches, in os.environ for the call.

    spython takes no environment argument for build/pull (its `environ=` elsewhere replaces the whole
    environment), so the variables are set on os.environ for the duration and restored afterwards.
    """
    dirs, _ = cache_dirs(env, allow_home)
    for workdir in cache_workdirs(env).values():  # checked before anything runs from there
        workdirs.prepare(workdir, "the Apptainer cache dir",
                         warn=lambda message: sys.stderr.write(f"distrain: warning: {message}\n"))
    binary = find_apptainer(env)
    shim = tempfile.mkdtemp(prefix="distrain-shim-")
    redirect = "2>&1" if merge_into == "stdout" else "1>&2"
    script = Path(shim, "singularity")
    script.write_text(f'#!/bin/sh\nexec "{binary}" "$@" {redirect}\n')
    script.chmod(0o755)
    saved = dict(os.environ)
    os.environ.update(dirs)
    os.environ["PATH"] = f"{shim}:{env.get('PATH', '')}"
    try:
        yield dirs
    finally:
        os.environ.clear()
        os.environ.update(saved)
        shutil.rmtree(shim, ignore_errors=True)


def _check_output_dir(output: str) -> None:
    parent = os.path.dirname(os.path.abspath(output))
    if not os.path.isdir(parent) or not os.access(parent, os.W_OK):
        raise EnvironmentProblem(f"cannot write the image to {output}: {parent} is missing or not writable")


def _partial(output: str) -> str:
    """The temporary path an image is written to beside OUTPUT, so a failure never leaves a stale image there."""
    return os.path.join(os.path.dirname(os.path.abspath(output)), f".{os.path.basename(output)}.partial-{os.getpid()}")


def _finish(tmp: str, output: str, what: str) -> str:
    if not os.path.isfile(tmp):
        raise DistrainError(f"{what} reported success but wrote no image at {tmp}", EXIT_BUILD_FAILED)
    os.replace(tmp, output)
    return output


def _stream(lines: Iterator[str], what: str, tmp: str) -> None:
    tail: list[str] = []
    try:
        for line in lines:
            sys.stdout.write(line if line.endswith("\n") else line + "\n")
            sys.stdout.flush()
            tail = (tail + [line.rstrip()])[-5:]
    except subprocess.CalledProcessError as exc:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        last = " | ".join(t for t in tail if t)[-400:]
        raise DistrainError(f"{what} failed (exit {exc.returncode}): {last}", EXIT_BUILD_FAILED) from None


DEFINITION = "Apptainer.def"


@contextlib.contextmanager
def _inside(directory: str) -> Iterator[None]:
    """contextlib.chdir, which Python 3.9 (a login node's) lacks."""
    before = os.getcwd()
    os.chdir(directory)
    try:
        yield
    finally:
        os.chdir(before)


def _installed_from() -> str | None:
    """The checkout distrain was pip-installed from (editable or not): pip records it (PEP 610's direct_url.json)."""
    import importlib.metadata
    import json
    from urllib.parse import unquote, urlparse

    with contextlib.suppress(Exception):
        url = json.loads(importlib.metadata.distribution("distrain").read_text("direct_url.json") or "{}").get("url")
        if url and url.startswith("file://"):
            return unquote(urlparse(url).path)
    return None


def build_context(definition: str | None, env: Mapping[str, str], cwd: str) -> tuple[str, str]:
    """(the definition file, the directory its %files are read from): `--def` as given, else the first Apptainer.def
    of the working directory, $DISTRAIN_HOME, $DISTRAIN, the checkout distrain was installed from, the one this
    package is in; so an admin builds from any directory."""
    if definition:
        if not os.path.isfile(definition):
            raise ConfigError(f"definition file {definition} not found")
        path = os.path.abspath(definition)
        return path, os.path.dirname(path)
    package_checkout = str(Path(__file__).resolve().parents[2])
    places = [cwd, env.get("DISTRAIN_HOME"), env.get("DISTRAIN"), _installed_from(), package_checkout]
    for place in filter(None, places):
        if os.path.isfile(os.path.join(place, DEFINITION)) and os.path.isdir(os.path.join(place, "entrypoint")):
            return os.path.join(os.path.abspath(place), DEFINITION), os.path.abspath(place)
    raise ConfigError(f"no {DEFINITION} here, in $DISTRAIN_HOME or in the checkout distrain was installed from: "
                      f"run it in the distrain checkout, or --def /path/to/distrain/{DEFINITION}")


def flavour_arguments(flavour: str, base_image: str | None, wheelhouse: str | None) -> dict[str, str]:
    """The build arguments that differ from Apptainer.def's defaults (the ngc flavour): BASE_IMAGE if given; for
    pypi also FLAVOUR, its base and its wheelhouse, checked here rather than after copying gigabytes."""
    if flavour not in FLAVOUR_BASES:
        raise ConfigError(f"unknown flavour {flavour!r}: {' or '.join(FLAVOUR_BASES)}")
    if flavour == "ngc":
        if wheelhouse:
            raise ConfigError("--wheelhouse is for the pypi flavour: the ngc flavour installs nothing from one")
        return {"BASE_IMAGE": base_image} if base_image else {}
    folder = os.path.realpath(wheelhouse or "wheelhouse")
    if not any(Path(folder).glob("tensorflow-*.whl")) or not any(Path(folder).glob("horovod-*.whl")):
        raise ConfigError(f"the pypi flavour installs from a wheelhouse, and {folder} has no TensorFlow or no "
                          "Horovod wheel: fill it first (scripts/gpu-wheelhouse.sh DIR), then --wheelhouse DIR")
    return {"FLAVOUR": flavour, "BASE_IMAGE": base_image or FLAVOUR_BASES[flavour], "WHEELHOUSE": folder}


def build(definition: str | None, output: str, env: Mapping[str, str], from_docker: str | None = None,
          fakeroot: bool = True, allow_home: bool = False, build_args: Mapping[str, str] | None = None,
          test: bool = True) -> str:
    """apptainer build OUTPUT from a definition file (build_context) with build_args (flavour_arguments), or from a
    local Docker image (docker-daemon://); test=False: without the definition's %test (apptainer build --notest)."""
    from spython.main import Client

    output = os.path.abspath(output)
    context = os.getcwd()
    if from_docker:
        recipe = f"docker-daemon://{from_docker}"
    else:
        recipe, context = build_context(definition, env, os.getcwd())
    _check_output_dir(output)
    options: list[str] = ["--fakeroot"] if fakeroot and not from_docker else []
    options += [] if test else ["--notest"]
    for key, value in (build_args or {}).items():
        options += ["--build-arg", f"{key}={value}"]
    tmp = _partial(output)
    with _apptainer_env(env, allow_home, merge_into="stdout"), _inside(context):  # %files' paths are relative
        _, lines = Client.build(recipe=recipe, image=tmp, sudo=False, stream=True, force=True, options=options)
        _stream(lines, "apptainer build", tmp)
    return _finish(tmp, output, "apptainer build")


def pull(uri: str, output: str, env: Mapping[str, str], allow_home: bool = False) -> str:
    """apptainer pull OUTPUT URI (docker://, oras://, library://...), replacing OUTPUT only on success."""
    from spython.main import Client

    _check_output_dir(output)
    tmp = _partial(output)
    with _apptainer_env(env, allow_home, merge_into="stderr"):
        _, lines = Client.pull(image=uri, name=os.path.basename(tmp), pull_folder=os.path.dirname(tmp), stream=True,
                               force=True)
        _stream(lines, "apptainer pull", tmp)
    return _finish(tmp, output, "apptainer pull")
