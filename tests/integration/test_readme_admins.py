"""The admins' first step as the README writes it: the `distrain` command installed without root, from the
checkout, in a fresh virtualenv under a user's $HOME (no TensorFlow needed on a login node)."""

import os
import subprocess
from pathlib import Path

from entrypoint import __version__
from helpers import ROOT
from readme_blocks import block


def test_the_get_distrain_block_installs_the_command_without_root(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    pip_cache = os.environ.get("PIP_CACHE_DIR") or str(Path.home() / ".cache" / "pip")  # the machine's, kept warm
    env = {"HOME": str(home), "DISTRAIN": str(ROOT), "PATH": f"{home}/.local/bin:/usr/local/bin:/usr/bin:/bin",
           "PIP_CACHE_DIR": pip_cache, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    # every line as written but the clone from the README's placeholder URL: $DISTRAIN is this checkout
    lines = [line for line in block("get-distrain").splitlines() if "git clone " not in line]
    assert len(lines) == len(block("get-distrain").splitlines()) - 1
    out = subprocess.run(["bash", "-euc", "\n".join(lines)], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.strip().splitlines()[-1] == f"distrain {__version__}", out.stdout
    assert (home / ".local" / "bin" / "distrain").is_symlink()
    # installed (not editable) from the checkout, it finds the checkout's Apptainer.def from any directory
    found = subprocess.run([str(home / ".local" / "distrain" / "bin" / "python"), "-c",
                            "import os; from entrypoint.tools.images import build_context as b; "
                            "print(b(None, {}, os.getcwd())[1])"], cwd=tmp_path, env=env, capture_output=True,
                           text=True, timeout=60)
    assert found.stdout.strip() == str(ROOT), found.stdout + found.stderr
