"""`distrain packages` builds over the Python that runs it: the login node's own distrain (the README's first step,
no TensorFlow) refuses in one line and names the image's distrain, whose Python the jobs run."""

import pytest

from entrypoint import packages
from entrypoint.errors import ConfigError


def test_a_python_without_tensorflow_is_refused_and_the_images_distrain_named(monkeypatch):
    monkeypatch.setattr(packages, "installed", lambda: {"typer": "0.29.2", "numpy": "2.0.0"})
    with pytest.raises(ConfigError, match=r'run "\$DISTRAIN/bin/distrain" packages'):
        packages.check_base()
    monkeypatch.setattr(packages, "installed", lambda: {"tensorflow-cpu": "2.17.1"})
    packages.check_base()  # a Python with TensorFlow: the jobs' own
