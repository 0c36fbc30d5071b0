"""A user's own `pip install --user` packages, and the image's packages they would shadow.

On clusters people `pip install --user`; Apptainer binds `$HOME`, so `~/.local/lib/python3.X/site-packages` would
be imported inside the image over the image's own packages (an old NumPy there breaks TensorFlow). The image sets
PYTHONNOUSERSITE=1 (Apptainer.def's %environment, the Dockerfile's ENV) unless DISTRAIN_USER_SITE=1 asks for it
(Apptainer.def's %runscript: Apptainer sets the host's variables after %environment; Docker: `-e PYTHONNOUSERSITE=`);
`doctor` says when a user site exists and whether it is read, and a script that fails to import a module the
user site holds gets one line naming the setting, not a traceback.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping


def directory(env: Mapping[str, str]) -> str:
    """Where this Python's user site is for the user `env` describes (site.getusersitepackages, from $HOME)."""
    base = env.get("PYTHONUSERBASE") or os.path.join(env.get("HOME") or os.path.expanduser("~"), ".local")
    return os.path.join(base, "lib", f"python{sys.version_info.major}.{sys.version_info.minor}", "site-packages")


def ignored(env: Mapping[str, str]) -> bool:
    """Python reads no user site when PYTHONNOUSERSITE is set to anything (the image's default)."""
    return bool(env.get("PYTHONNOUSERSITE"))


def describe(env: Mapping[str, str]) -> str:
    """doctor's line."""
    where = directory(env)
    if not os.path.isdir(where):
        return f"user site: none ({where})"
    held = sorted(n for n in os.listdir(where) if not n.endswith((".dist-info", ".egg-info", ".pth")))
    shown = ", ".join(held[:6]) + (", ..." if len(held) > 6 else "")
    if ignored(env):
        return f"user site: {where} ({shown or 'empty'}) is not read (PYTHONNOUSERSITE): DISTRAIN_USER_SITE=1 reads it"
    return f"user site: {where} ({shown or 'empty'}) is read, before the image's own packages"


def unread_module(exc: BaseException, env: Mapping[str, str]) -> str | None:
    """The one line for a script's ModuleNotFoundError whose module the unread user site holds, else None."""
    if not isinstance(exc, ModuleNotFoundError) or not exc.name or not ignored(env):
        return None
    top = exc.name.split(".")[0]
    where = directory(env)
    if not any(os.path.exists(os.path.join(where, name)) for name in (top, f"{top}.py")):
        return None
    return (f"module {top!r} is in your user site {where}, which the image does not read (it could shadow the "
            f"image's TensorFlow and NumPy): set DISTRAIN_USER_SITE=1 to read it")
