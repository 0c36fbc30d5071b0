"""compat/registry.py's checks, run for real on each TensorFlow line (`core`): every patch distrain makes finds the
function, method or attribute it knows in the installed TensorFlow, Keras, tf_keras and Horovod, as `distrain
doctor` shows them."""

import re

import pytest

from entrypoint.compat import registry
from helpers import DISTRAIN, run


@pytest.mark.core
def test_doctor_lists_every_patch_and_each_finds_what_it_knows_here():
    out = run([DISTRAIN, "doctor", "--patches"])
    assert out.returncode == 0, out.stdout[-3000:]
    listed = out.stdout.split("patches of other libraries (compat/registry.py)", 1)[1].splitlines()[1:]
    states = {}
    for line in listed:
        if found := re.match(r"  (\S+) +(keras3|legacy) +\S+ +\S+ +\S+(?: modes)? +(.+)$", line):
            states[(found[1], found[2])] = found[3]
    assert {name for name, _ in states} == set(registry.BY_NAME), out.stdout[-3000:]
    assert set(states.values()) <= {"ok", "not installed"}, out.stdout[-3000:]
    # this venv has TensorFlow, Keras 3, tf_keras and Horovod: every entry is checked, none skipped
    assert "not installed" not in states.values(), out.stdout[-3000:]
    short = run([DISTRAIN, "doctor"])  # without --patches: one line for them all, the whole report in 40 lines
    assert short.returncode == 0 and len(short.stdout.splitlines()) <= 40, short.stdout
    assert re.search(rf"^patches: {len(registry.PATCHES)} of tensorflow 2\.\d+\.\d+, keras 3\.\S+, tf_keras "
                     r"2\.\S+, horovod 0\.28\.1: all as proven", short.stdout, re.M), short.stdout
