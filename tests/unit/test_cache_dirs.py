"""Where Apptainer's cache goes for `distrain image` (pure logic; the real pull is in container/)."""

import pytest

from entrypoint.errors import ConfigError
from entrypoint.tools.images import cache_dirs


def test_scratch_first_and_never_home():
    dirs, _ = cache_dirs({"HOME": "/home/u", "SCRATCH": "/scratch/u", "WORK": "/work/u", "USER": "u"})
    assert dirs == {"APPTAINER_CACHEDIR": "/scratch/u/distrain/apptainer/cache",
                    "APPTAINER_TMPDIR": "/scratch/u/distrain/apptainer/tmp",
                    "APPTAINER_CONFIGDIR": "/scratch/u/distrain/apptainer/config"}


def test_distrain_cache_wins_and_tmp_is_the_last_resort():
    assert cache_dirs({"DISTRAIN_CACHE": "/c", "SCRATCH": "/s"})[0]["APPTAINER_CACHEDIR"] == "/c/apptainer/cache"
    assert cache_dirs({"USER": "u"})[0]["APPTAINER_TMPDIR"] == "/tmp/u/distrain/apptainer/tmp"


def test_cache_under_home_is_refused_unless_allowed():
    env = {"HOME": "/home/u", "APPTAINER_CACHEDIR": "/home/u/.apptainer/cache", "SCRATCH": "/s"}
    with pytest.raises(ConfigError, match=r"APPTAINER_CACHEDIR would be under \$HOME .*--allow-home"):
        cache_dirs(env)
    dirs, note = cache_dirs(env, allow_home=True)
    assert dirs["APPTAINER_CACHEDIR"] == "/home/u/.apptainer/cache" and note == "set by you"


def test_the_image_flavours_build_arguments(tmp_path):
    """`distrain image build --flavour`: ngc is the definition's default (nothing passed but a --base-image); pypi
    passes its plain Debian base and a wheelhouse that has TensorFlow and Horovod in it, or stops before building."""
    from entrypoint.tools.images import flavour_arguments

    assert flavour_arguments("ngc", None, None) == {}
    assert flavour_arguments("ngc", "registry/tf:1", None) == {"BASE_IMAGE": "registry/tf:1"}
    with pytest.raises(ConfigError, match="no TensorFlow or no Horovod wheel: fill it first"):
        flavour_arguments("pypi", None, str(tmp_path))
    for wheel in ("tensorflow-2.21.0-cp311-cp311-manylinux_2_27_x86_64.whl", "horovod-0.28.1-cp311-linux.whl"):
        (tmp_path / wheel).touch()
    assert flavour_arguments("pypi", None, str(tmp_path)) == {
        "FLAVOUR": "pypi", "BASE_IMAGE": "docker.io/library/debian:12", "WHEELHOUSE": str(tmp_path)}
    with pytest.raises(ConfigError, match="unknown flavour 'conda': ngc or pypi"):
        flavour_arguments("conda", None, None)
    with pytest.raises(ConfigError, match="--wheelhouse is for the pypi flavour"):
        flavour_arguments("ngc", None, str(tmp_path))
