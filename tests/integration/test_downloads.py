"""Downloads under ranks (#84): every rank calls `keras.utils.get_file(..., extract=True)` into one cache, as
keras-io's examples do; one downloads and extracts, the others read the same files; a node without network is one
line. Served from this machine (127.0.0.1): the network here reaches no dataset host."""

import functools
import http.server
import os
import tarfile
import threading

import numpy as np
import pytest

from helpers import DISTRAIN, MPIRUN, ROOT, keras_env, results, run

SCRIPT = str(ROOT / "tests" / "integration" / "scripts" / "downloads.py")
LAUNCH = {"mwm": [DISTRAIN, "launch", "-n", "2"], "horovod": [*MPIRUN, DISTRAIN, "run"]}


@pytest.fixture(scope="module")
def archive_url(tmp_path_factory):  # noqa: ANN001, ANN201
    """An archive of 400 files (12 MB), large enough that an extraction takes a while, served over HTTP."""
    served = tmp_path_factory.mktemp("served")
    (served / "texts").mkdir()
    noise = np.random.default_rng(0)
    for index in range(400):
        (served / "texts" / f"{index:04d}.txt").write_bytes(noise.bytes(30_000))
    with tarfile.open(served / "texts.tar.gz", "w:gz") as archive:
        archive.add(served / "texts", arcname="texts")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(served))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/texts.tar.gz"
    server.shutdown()


@pytest.mark.parametrize("mode", ["mwm", "horovod"])
def test_every_rank_reads_the_archive_one_rank_extracted(mode, archive_url, tmp_path):
    """Without distrain's turns, ranks read files another rank was extracting again: their digests differed in 2
    of 3 MWM x2 runs of this script (Keras 3.3), silently."""
    out = run([*LAUNCH[mode], SCRIPT, archive_url, str(tmp_path)], env=keras_env("keras3"), timeout=300)
    assert out.returncode == 0, out.stdout[-3000:]
    found = results(out.stdout)
    assert len(found) == 2 and len({r["files"] for r in found}) == 1, out.stdout[-3000:]
    assert len(set(found[0]["files"].split(","))) == 1 and found[0]["files"].startswith("400x"), found
    assert out.stdout.count("Downloading data from") == 1, out.stdout[-3000:]


def test_a_node_without_network_is_one_line_naming_the_file_and_the_login_node(tmp_path):
    out = run([DISTRAIN, "launch", "-n", "2", SCRIPT, "http://127.0.0.1:9/texts.tar.gz", str(tmp_path)],
              env=keras_env("keras3"), timeout=300)
    assert out.returncode == 3, out.stdout[-3000:]
    errors = [line for line in out.stdout.splitlines() if "distrain: error:" in line]
    assert errors and all("could not download texts.tar.gz" in e and "on the login node" in e for e in errors), \
        out.stdout[-3000:]
    assert "Traceback" not in out.stdout
    assert oct(os.stat(tmp_path / "datasets" / ".distrain-get-file.lock").st_mode & 0o777) == "0o600"
