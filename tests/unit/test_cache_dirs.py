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
