"""The image's build checks its base (image/expect.py, run by image/install.sh for every flavour): what it carries
passes, anything else fails the build with the versions found. (pytest's version stands in for TensorFlow's: the
same check, without a TensorFlow import in a unit test.)"""

import subprocess
import sys

import pytest

from helpers import ROOT

EXPECT = str(ROOT / "image" / "expect.py")


def expect(what: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, EXPECT, what], capture_output=True, text=True, timeout=60)


def test_a_base_with_the_expected_versions_passes_and_another_fails_the_build():
    major_minor = pytest.__version__.rsplit(".", 1)[0]
    ok = expect(f"pytest={major_minor}")
    assert ok.returncode == 0 and ok.stdout.startswith(f"image/expect.py: ok: pytest {pytest.__version__}"), ok
    wrong = expect(f"pytest={major_minor} horovod_is_not_here=0.28.1 pytest=2.99")
    assert wrong.returncode == 2, wrong
    assert "FAILED: horovod_is_not_here absent (expected 0.28.1.*)" in wrong.stdout
    assert f"FAILED: pytest {pytest.__version__} (expected 2.99.*)" in wrong.stdout
    assert "state what yours carries (build argument EXPECT)" in wrong.stderr
