"""A path the script needs that is not inside the container: one line naming it and the bind that brings it in.

Inside an image the script sees only what is bound: the job scripts bind the script's directory and the output
directory, Apptainer itself `$HOME`, the working directory and `/tmp`. Data on `/scratch/...` or a project space
is then missing, and the script's own `FileNotFoundError` does not say why. Only a path whose top directory does
not exist in the container at all is certainly outside every bind; any other missing file may really be missing,
and keeps the script's traceback.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

APPTAINER, DOCKER = "apptainer", "docker"
# TensorFlow's NotFoundError and others name the path in their message: "/scratch/d/x.tfrecord; No such file ..."
_PATH_IN_MESSAGE = re.compile(r"(/[^\s;:'\"]+)")


def container(env: Mapping[str, str], dockerenv: str = "/.dockerenv") -> str:
    """The container this process runs in ("" for none): Apptainer and Singularity say so in the environment,
    Docker leaves /.dockerenv."""
    if env.get("APPTAINER_CONTAINER") or env.get("SINGULARITY_CONTAINER"):
        return APPTAINER
    return DOCKER if os.path.exists(dockerenv) else ""


def _missing_path(exc: BaseException) -> str | None:
    if isinstance(exc, FileNotFoundError) and isinstance(exc.filename, str):
        return exc.filename
    if type(exc).__name__ == "NotFoundError":  # tf.errors.NotFoundError, without importing TensorFlow here
        found = _PATH_IN_MESSAGE.search(str(exc))
        return found.group(1) if found else None
    return None


def outside(exc: BaseException, where: str) -> str | None:
    """The one line for a script's error that is a path outside the container `where` (container()), else None."""
    path = _missing_path(exc) if where else None
    if not path or not os.path.isabs(path):
        return None
    top = os.path.join("/", path.split(os.sep)[1])
    if os.path.exists(top):
        return None
    parent = os.path.dirname(path.rstrip("/")) or path
    if where == DOCKER:
        return (f"{path} is not in the container (no {top} there): mount it, `docker run -v {parent}:{parent} ...`")
    return (f"{path} is not in the container (no {top} there): bind it, DISTRAIN_BIND={parent} (or "
            f"DISTRAIN_DATA_DIR; `apptainer run --bind {parent}` by hand)")
