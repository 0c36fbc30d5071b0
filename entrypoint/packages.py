"""A user's own packages (DISTRAIN_REQUIREMENTS=requirements.txt), layered on the image's, never replacing them.

The image holds TensorFlow, Keras, NumPy and Horovod built to work together; a script that also needs `pandas` or
the lab's package gets a virtualenv of its own: built once per requirements digest under the output directory
(never `$HOME`), by the first rank to take its lock while the others wait (several nodes share the directory), or
beforehand by `distrain packages` on a login node where compute nodes have no internet. Every distribution the
image has is pinned as a pip constraint, so nothing it holds can be replaced; a requirement that names one of
TensorFlow, Keras, tf_keras, NumPy or Horovod at another version is refused with one line before pip runs. The
virtualenv sees the image's packages (a `.pth` to them: pip resolves against them), and the run puts its
site-packages first on `sys.path` before TensorFlow loads.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.metadata
import os
import shutil
import site
import subprocess
import sys
import time
from collections.abc import Callable

from .errors import ConfigError, EnvironmentProblem
from .workdirs import make_private_dirs

GUARDED = ("tensorflow", "tensorflow-cpu", "keras", "tf-keras", "numpy", "horovod")
BUILD_DEADLINE_SECONDS = 1800.0  # how long a rank waits for another rank's (or a login node's) build
COMPLETE = ".complete"


def _canonical(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def check_base() -> None:
    """`distrain packages` builds over the Python that runs it: the login node's own distrain (the README's first
    step, no TensorFlow) would build them over another base than the jobs' Python."""
    if not {"tensorflow", "tensorflow-cpu"} & set(installed()):
        raise ConfigError("this distrain's Python has no TensorFlow, so packages built over it would not be the "
                          'image\'s: run "$DISTRAIN/bin/distrain" packages (the image\'s distrain; with '
                          "USE_CONTAINER=0, the virtualenv's)")


def installed() -> dict[str, str]:
    """The image's distributions: canonical name -> version."""
    found: dict[str, str] = {}
    for dist in importlib.metadata.distributions():
        name = dist.metadata.get("Name")
        if name:
            found.setdefault(_canonical(name), dist.version)
    return found


def check(requirements: str, have: dict[str, str]) -> None:
    """Refuse, before anything installs, a requirement that would replace one of the image's own frameworks."""
    from packaging.requirements import InvalidRequirement, Requirement

    with open(requirements) as handle:
        lines = [line.split("#")[0].strip() for line in handle]
    for line in lines:
        if not line or line.startswith("-"):
            continue
        try:
            wanted = Requirement(line)
        except InvalidRequirement:
            raise ConfigError(f"{requirements}: {line!r} is not a requirement pip reads") from None
        name = _canonical(wanted.name)
        if name in GUARDED and (name not in have or not wanted.specifier.contains(have[name], prereleases=True)):
            raise ConfigError(f"{requirements}: {line!r} would replace the image's {wanted.name} "
                              f"{have.get(name, '(absent)')}: drop it (the image's is used) or use another image")


def directory(output_dir: str, requirements: str) -> str:
    """Where the virtualenv for these requirements on this Python is: one per digest."""
    with open(requirements, "rb") as handle:
        digest = hashlib.sha256(handle.read() + sys.version.encode()).hexdigest()[:12]
    return os.path.join(output_dir, "packages", digest)


def site_packages(venv: str) -> str:
    return os.path.join(venv, "lib", f"python{sys.version_info.major}.{sys.version_info.minor}", "site-packages")


def _build(venv: str, requirements: str, say: Callable[[str], None]) -> None:
    have = installed()
    check(requirements, have)
    tmp = f"{venv}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", tmp], check=True, capture_output=True)
    with open(os.path.join(site_packages(tmp), "_distrain_image.pth"), "w") as handle:
        handle.write("\n".join(p for p in sys.path if p.endswith(("site-packages", "dist-packages"))) + "\n")
    constraints = os.path.join(tmp, "image-constraints.txt")
    with open(constraints, "w") as handle:
        handle.write("".join(f"{name}=={version}\n" for name, version in sorted(have.items())))
    say(f"installing {requirements} into {venv} (once for these requirements)")
    # no cache: pip's is under $HOME (~/.cache/pip), where distrain writes nothing; each digest is built once
    pip = [os.path.join(tmp, "bin", "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check",
           "--no-cache-dir"]
    out = subprocess.run([*pip, "-r", requirements, "-c", constraints], capture_output=True, text=True)
    if out.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        last = [line for line in (out.stderr or out.stdout).splitlines() if line.strip()][-1:] or ["(no output)"]
        raise ConfigError(f"pip could not install {requirements} beside the image's own packages: {last[0][:300]}")
    open(os.path.join(tmp, COMPLETE), "w").close()
    os.replace(tmp, venv)


def ensure(output_dir: str, requirements: str, say: Callable[[str], None],
           deadline: float = BUILD_DEADLINE_SECONDS) -> str:
    """The virtualenv for `requirements`, built here if nobody built it yet; return its site-packages."""
    venv = directory(output_dir, requirements)
    if not os.path.exists(os.path.join(venv, COMPLETE)):
        make_private_dirs(os.path.dirname(venv))
        with open(venv + ".lock", "a") as lock:
            give_up = time.monotonic() + deadline
            while True:
                with contextlib.suppress(BlockingIOError):
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                if time.monotonic() > give_up:
                    raise EnvironmentProblem(f"{venv} is being built by another process for over {deadline:.0f} s: "
                                             "remove its .lock if nothing builds it")
                time.sleep(1.0)
            if not os.path.exists(os.path.join(venv, COMPLETE)):  # the rank before us built it meanwhile
                _build(venv, requirements, say)
    return site_packages(venv)


def use(site_dir: str) -> None:
    """Put the virtualenv's packages first, before TensorFlow loads (its .pth files processed)."""
    before = list(sys.path)
    site.addsitedir(site_dir)
    added = [p for p in sys.path if p not in before]
    sys.path[:] = added + before
