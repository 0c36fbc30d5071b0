"""Work directories on shared machines: created private, and a default one used only when it is really ours.

Login and compute nodes are shared. A `/tmp/$USER/distrain` that another user created first (or made
world-writable) would let them replace the checkpoint a run resumes from, or plant image layers that the next
`apptainer run` executes. So, as ssh treats `~/.ssh`:

- every directory distrain creates is created 0700;
- a *default* work dir (`/tmp/$USER/distrain`, `$SCRATCH/distrain`, `$WORK/distrain` and all below it) is used
  only if each of its existing components from the first one distrain owns (`/tmp/$USER`, `$SCRATCH/distrain`)
  down is owned by this user and not writable by group or others; otherwise one line and exit 3, nothing read
  or written there;
- a directory the user named (`DISTRAIN_OUTPUT_DIR`, `DISTRAIN_CHECKPOINT_DIR`, `DISTRAIN_CACHE`, ...) is the
  user's choice (project spaces are group-writable on purpose): world-writable without the sticky bit gets a
  warning, not a refusal.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import stat
from collections.abc import Mapping
from dataclasses import dataclass

from .errors import EnvironmentProblem


@dataclass(frozen=True)
class WorkDir:
    """A directory distrain will write to. `owned_from` is set for a default location: the first component
    distrain itself owns, from which down every existing directory must be this user's and private."""

    path: str
    owned_from: str | None = None

    @property
    def is_default(self) -> bool:
        return self.owned_from is not None

    def below(self, *parts: str) -> WorkDir:
        return WorkDir(os.path.join(self.path, *parts), self.owned_from)


def user_name(env: Mapping[str, str]) -> str:
    """$USER, else the passwd name, else uid<N> (`docker run --user 1234` runs as a uid with no passwd entry)."""
    if env.get("USER") or env.get("LOGNAME"):
        return env.get("USER") or env["LOGNAME"]
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return f"uid{os.getuid()}"


def root(env: Mapping[str, str], override: str) -> WorkDir:
    """$override if set (the user's choice), else $SCRATCH/distrain, $WORK/distrain, /tmp/$USER/distrain (never
    $HOME, whose quota checkpoints and image layers fill)."""
    if env.get(override):
        return WorkDir(env[override])
    for name in ("SCRATCH", "WORK"):
        if env.get(name):
            path = os.path.join(env[name], "distrain")
            return WorkDir(path, owned_from=path)
    user_tmp = os.path.join("/tmp", user_name(env))
    return WorkDir(os.path.join(user_tmp, "distrain"), owned_from=user_tmp)


def chosen_by(env: Mapping[str, str], override: str) -> str:
    """Why `root` chose its directory, for the run's first line: a user who set nothing learns where outputs go."""
    if env.get(override):
        return f"from {override}"
    for name in ("SCRATCH", "WORK"):
        if env.get(name):
            return f"from ${name}"
    return f"in this machine's /tmp: no {override}, $SCRATCH or $WORK set"


def _components(top: str, path: str) -> list[str]:
    """`top` and every directory between it and `path`, `path` included (top must contain path)."""
    top, path = os.path.abspath(top), os.path.abspath(path)
    chain = [top]
    rest = os.path.relpath(path, top)
    if rest != ".":
        for part in rest.split(os.sep):
            chain.append(os.path.join(chain[-1], part))
    return chain


def problem(workdir: WorkDir) -> str | None:
    """Why a default work dir must not be used (another owner, writable by others), or None."""
    if not workdir.is_default:
        return None
    uid = os.getuid()
    for directory in _components(workdir.owned_from, workdir.path):
        try:
            info = os.lstat(directory)
        except FileNotFoundError:
            break  # distrain will create the rest, 0700
        if info.st_uid != uid:
            why = f"is owned by uid {info.st_uid}, not you (uid {uid})"
        elif stat.S_ISLNK(info.st_mode):
            why = "is a symbolic link"
        elif not stat.S_ISDIR(info.st_mode):
            why = "is not a directory"
        elif info.st_mode & 0o022:
            why = f"is writable by {'others' if info.st_mode & 0o002 else 'its group'} (mode {info.st_mode & 0o777:o})"
        else:
            continue
        return (f"the default work dir {directory} {why}: remove it, or set DISTRAIN_OUTPUT_DIR "
                "(DISTRAIN_CACHE for images) to a directory of your own")
    return None


def make_private_dirs(path: str) -> None:
    """mkdir -p with every directory it creates 0700 (os.makedirs' mode reaches the last one only)."""
    missing = []
    current = os.path.abspath(path)
    while not os.path.isdir(current):
        missing.append(current)
        current = os.path.dirname(current)
    for directory in reversed(missing):
        with contextlib.suppress(FileExistsError):  # another rank on this host made it first
            os.mkdir(directory, 0o700)


def prepare(workdir: WorkDir, what: str = "the work dir", warn=None) -> str:  # noqa: ANN001 - a log function
    """Check, then create (0700) a work dir; return its path. Raises EnvironmentProblem (exit 3)."""
    why = problem(workdir)
    if why:
        raise EnvironmentProblem(why)
    try:
        make_private_dirs(workdir.path)
    except OSError as exc:
        raise EnvironmentProblem(
            f"{what} {workdir.path} is not writable ({exc.strerror}): choose a writable directory"
        ) from None
    why = problem(workdir)  # a race with another user between the check and the mkdir
    if why:
        raise EnvironmentProblem(why)
    if not workdir.is_default and warn is not None:
        mode = os.stat(workdir.path).st_mode
        if mode & 0o002 and not mode & stat.S_ISVTX:
            warn(f"{workdir.path} is writable by every user (mode {mode & 0o777:o}, no sticky bit): anyone on "
                 "this machine can replace what distrain writes there")
    return workdir.path


def make_tree_private(path: str) -> None:
    """chmod 0700 the directories and 0600 the files below `path` (checkpoints TensorFlow wrote with the umask)."""
    for directory, dirs, files in os.walk(path):
        for name in dirs:
            _chmod(os.path.join(directory, name), 0o700)
        for name in files:
            _chmod(os.path.join(directory, name), 0o600)


def _chmod(path: str, mode: int) -> None:
    if os.path.islink(path):
        return
    with contextlib.suppress(OSError):  # gone meanwhile (another rank's temp file)
        os.chmod(path, mode)
