"""Helpers the tests share: paths, a clean environment, running commands, reading the examples' RESULT lines."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent
DISTRAIN = str(VENV_BIN / "distrain")
# Under pytest-xdist (scripts/test.sh), the worker running this test: gw0, gw1, ...
XDIST_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
# scripts/test.sh --full: the whole product of combinations, and what CI's default tier leaves out (tests/README.md)
FULL_TIER = os.environ.get("DISTRAIN_TEST_TIER") == "full"
# Horovod's background thread wakes every cycle (HOROVOD_CYCLE_TIME, ms) to negotiate with the other ranks, and it
# spins while its rank waits (a trace, a checkpoint, the other rank's start): at Horovod's default it burns about half
# a core per rank on CI's 2 cores (the custom-loop BatchNorm script: 94 CPU-s at the default, 52 at 20 ms). A longer
# cycle delays a collective by at most that much; what the tests prove (sync, resume, stops) does not depend on it.
HOROVOD_CYCLE_MS = "20"
# Horovod x2 the two ways users start it. Open MPI's mpirun where the launcher is not what a test is about: horovodrun
# --gloo first imports TensorFlow once more to check that Horovod was built with Gloo (horovod/common/util.py,
# gloo_built), 4-5 CPU-seconds a launch on CI's 2 cores. The Gloo path keeps tests of its own (tests/README.md).
# --bind-to none: Open MPI binds 2 ranks to a core each, and two tests at once would share those 2 cores unevenly.
MPIRUN = ["mpirun", "--allow-run-as-root", "--tag-output", "-np", "2", "--bind-to", "none", "-x", "PATH",
          "-x", "PYTHONUNBUFFERED", "-mca", "btl_tcp_if_include", "lo", "-mca", "oob_tcp_if_include", "lo"]
HOROVODRUN_GLOO = ["horovodrun", "-np", "2", "--gloo"]
# TensorFlow's and gRPC's C++ INFO lines and absl's notice, which distrain's log filter drops (log.py)
CPP_CHATTER = re.compile(r"^(\[\d/\d\] )?(I\d{4} \d\d:\d\d:\d\d|WARNING: All log messages before absl)", re.MULTILINE)


def run_once(kept: Path, key: tuple, produce: Callable[[Path, Path], subprocess.CompletedProcess]) -> Path:
    """The output directory of a run that several tests compare against (a run never stopped), produced once a
    session by produce(output_dir, state_dir), which must exit 0: the first test to need it runs it, the others
    (on any xdist worker) wait on its lock and read it. `key` names everything the run depends on."""
    name = hashlib.sha256(repr(key).encode()).hexdigest()[:12]
    kept.mkdir(exist_ok=True)
    with open(kept / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (kept / f"{name}.passed").exists():
            shutil.rmtree(kept / name, ignore_errors=True)
            (kept / name).mkdir()
            done = produce(kept / name, kept / f"{name}-state")
            assert done.returncode == 0, done.stdout[-3000:]
            (kept / f"{name}.passed").touch()
    return kept / name


def full_tier_only(why: str):  # noqa: ANN201 - a pytest mark
    """Skip in CI's default tier (said in the skip reason); run by scripts/test.sh --full."""
    import pytest

    return pytest.mark.skipif(not FULL_TIER, reason=f"--full tier only: {why}")


def clean_env(**extra: str) -> dict[str, str]:
    """The test process's environment minus anything that would change distrain's decisions."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "OMPI_", "PMI", "HOROVOD_", "DISTRAIN_", "TF_CONFIG"))
           and k not in ("CUDA_VISIBLE_DEVICES", "http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY")}
    env["PATH"] = f"{VENV_BIN}:{env.get('PATH', '')}"
    env["PYTHONUNBUFFERED"] = "1"
    env["HOROVOD_CYCLE_TIME"] = HOROVOD_CYCLE_MS
    if XDIST_WORKER:  # each worker its own default work dir (/tmp/$USER/distrain): the same command run by two
        env["USER"] = f"{env.get('USER', 'root')}-{XDIST_WORKER}"  # tests at once would be one run, in use
    env.update(extra)
    return env


def run(cmd: list[str], env: dict[str, str] | None = None, timeout: float = 300, cwd: Path = ROOT,
        **kwargs) -> subprocess.CompletedProcess:
    """Run a command, capture stdout+stderr together as text; past `timeout` the test fails with its last lines.
    Undecodable bytes are replaced: a launcher that tags or merges the ranks' output (mpirun, srun) can cut a progress
    bar's character in two."""
    kwargs.setdefault("errors", "replace")
    try:
        return subprocess.run(cmd, env=env or clean_env(), cwd=cwd, timeout=timeout, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, **kwargs)
    except subprocess.TimeoutExpired as exc:
        output = exc.output.decode(errors="replace") if isinstance(exc.output, bytes) else exc.output or ""
        raise AssertionError(f"{cmd[:3]} still running after {timeout} s; its last lines:\n{output[-3000:]}") from None


def free_ports(count: int) -> list[int]:
    """Ports free now, outside the ephemeral range, for workers a test starts by hand (distrain's own draw)."""
    from entrypoint.ports import reserved_ports

    with reserved_ports(count) as ports:
        return list(ports)


class Watched:
    """A started process (its own session) whose output, stdout and stderr merged, a thread reads: every wait on
    it has a deadline even while the process prints nothing, and a deadline missed fails the test with the
    process's last lines and ends the process group, so a hang costs one test, never the suite."""

    def __init__(self, cmd: list[str], env: dict[str, str] | None = None, cwd: Path = ROOT, **kwargs) -> None:
        self.proc = subprocess.Popen(cmd, cwd=cwd, env=env or clean_env(), stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, errors="replace", start_new_session=True,
                                     **kwargs)
        self.pid, self._seen, self._read = self.proc.pid, [], 0
        self._changed = threading.Condition()
        self._reader = threading.Thread(target=self._read_all, daemon=True)
        self._reader.start()

    def _read_all(self) -> None:
        for line in self.proc.stdout:
            with self._changed:
                self._seen.append(line)
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    @property
    def output(self) -> str:
        with self._changed:
            return "".join(self._seen)

    def until(self, pattern: str | Callable[[str], bool], timeout: float = 180) -> str:
        """The output up to the first line matching the regex `pattern` (or up to where `pattern(output so far)`
        holds); past `timeout`, or at the end of the output without it, the test fails with the last lines."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                for index in range(self._read, len(self._seen)):
                    seen = "".join(self._seen[:index + 1])
                    if pattern(seen) if callable(pattern) else re.search(pattern, self._seen[index]):
                        self._read = index + 1
                        return seen
                self._read = len(self._seen) if not callable(pattern) else self._read
                ended = not self._reader.is_alive()
                if ended or time.monotonic() > deadline:
                    break
                self._changed.wait(min(1.0, max(0.0, deadline - time.monotonic())))
        self._fail(f"{'ended' if ended else f'still running after {timeout} s'} without {pattern!r}")
        raise AssertionError("unreachable")

    def rest(self, timeout: float = 120) -> str:
        """Wait for the process to end (deadline `timeout`); the output after what `until` returned."""
        self.wait(timeout)
        self._reader.join(timeout=10)
        with self._changed:
            rest, self._read = "".join(self._seen[self._read:]), len(self._seen)
        return rest

    def wait(self, timeout: float = 120) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self._fail(f"still running {timeout} s after the test waited for its end")
            raise

    @property
    def returncode(self) -> int | None:
        return self.proc.poll()

    def send_signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)

    def _fail(self, what: str) -> None:
        tail = self.output[-3000:]
        self.kill()
        raise AssertionError(f"{' '.join(map(str, self.proc.args[:3]))}: {what}; its last lines:\n{tail}")

    def __enter__(self) -> Watched:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            self.kill()


RESULT = re.compile(r"RESULT ((?:\w+=[\w.\-]+ ?)+)")


def results(output: str) -> list[dict[str, str]]:
    """The RESULT lines the examples print, as dicts, one per rank that finished. Only key=value tokens count:
    mpirun's --tag-output can glue its next tag onto the end of a line."""
    return [dict(kv.split("=", 1) for kv in m.group(1).split()) for m in RESULT.finditer(output)]


def assert_trained_in_sync(output: str, workers: int, loss_before: float | None = None) -> list[dict[str, str]]:
    """Every worker finished, the loss fell, and all ended with bit-identical weights.
    loss_before: a resumed run's loss at its start, before the stop; the loss must end below it (the resumed part
    alone may be a single epoch, whose first and last loss are one number)."""
    found = results(output)
    assert len(found) == workers, output[-3000:]
    assert len({r["weights"] for r in found}) == 1, f"workers diverged: {found}"
    for r in found:
        assert float(r["loss_last"]) < (float(r["loss_first"]) if loss_before is None else loss_before), r
    return found


# Both Keras families distrain runs: Keras 3 (what `auto` picks with TensorFlow >= 2.16) and tf_keras.
KERAS_FAMILIES = ("keras3", "legacy")


def keras_env(family: str, **extra: str) -> dict[str, str]:
    """clean_env with the Keras family forced, as a user would with DISTRAIN_KERAS."""
    return clean_env(DISTRAIN_KERAS=family, **extra)


def load_model(path: Path, family: str, input_shape: tuple = (8, 8, 1), counting: bool = False) -> str:
    """Load a saved model in a fresh process with plain Keras of that family (no distrain), predict once.
    counting: the model holds the corpus' sample-counting layer (tests/compat/scripts/counting.py)."""
    legacy = "import os; os.environ['TF_USE_LEGACY_KERAS'] = '1'; " if family == "legacy" else ""
    custom = "None"
    if counting:
        legacy += f"import sys; sys.path.insert(0, {str(ROOT / 'tests' / 'compat' / 'scripts')!r}); "
        custom = "{'CountSamples': type(__import__('counting').layer(tf.keras))}"
    code = (f"{legacy}import numpy as np, tensorflow as tf; "
            f"m = tf.keras.models.load_model({str(path)!r}, safe_mode=False, custom_objects={custom}); "
            f"print('OUT', m.predict(np.zeros((1, *{input_shape!r}), 'float32'), verbose=0).shape, "
            "type(m).__module__.split('.')[0])")
    out = run(["python", "-c", code])
    assert "OUT (1, " in out.stdout, out.stdout[-2000:]
    assert ("tf_keras" if family == "legacy" else "keras") == out.stdout.split()[-1], out.stdout[-500:]
    return out.stdout


@contextlib.contextmanager
def small_tmpfs(path: Path, size: str) -> Iterator[Path]:
    """A tmpfs of `size` mounted at `path` (a disk that fills up), unmounted afterwards; skips where mount is
    not allowed."""
    import pytest

    path.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True,
                             timeout=300)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True, timeout=300)


def a_wheel(folder):
    """labtools 1.0, as a lab's own package: a local wheel (the README's wheel directory; no index)."""
    folder.mkdir()
    files = {"labtools/__init__.py": "ANSWER = 42\n",
             "labtools-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: labtools\nVersion: 1.0\n",
             "labtools-1.0.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                             "Tag: py3-none-any\n"}
    files["labtools-1.0.dist-info/RECORD"] = "".join(f"{p},,\n" for p in [*files, "labtools-1.0.dist-info/RECORD"])
    with zipfile.ZipFile(folder / "labtools-1.0-py3-none-any.whl", "w") as wheel:
        for path, text in files.items():
            wheel.writestr(path, text)
    return folder


# An ordinary account (scripts/install.sh makes it, with the subordinate ids `apptainer build --fakeroot` needs):
# the tests that follow a user without root run their commands as it.
TEST_USER = os.environ.get("DISTRAIN_TEST_USER", "distrain-user")
USERS_PIP_CACHE = Path(f"/var/cache/distrain/pip-{TEST_USER}")  # the account's pip cache, kept between runs


def account_exists() -> bool:
    return subprocess.run(["id", TEST_USER], capture_output=True, timeout=10).returncode == 0


def as_the_user(command: str, cwd: Path, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    """`command` in bash as TEST_USER, with only `env` (a login's variables), never as root."""
    return subprocess.run(["runuser", "-u", TEST_USER, "--", "env", "-i", *(f"{k}={v}" for k, v in env.items()),
                           "bash", "-euc", command], cwd=cwd, capture_output=True, text=True, timeout=timeout)


def the_users_own(path: Path) -> Path:
    """`path` (made by root for the test) handed to TEST_USER, the whole tree."""
    subprocess.run(["chown", "-R", f"{TEST_USER}:", str(path)], check=True, timeout=120)
    return path


def copy_of_the_checkout(destination: Path) -> Path:
    """What `git clone` of this checkout brings, as it stands now: the tracked and the untracked files git does not
    ignore, from the working tree (the account the tests run as cannot clone a repository another user owns without
    git's safe.directory, and a clone would leave out what is not committed yet)."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, check=True, timeout=60).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file():
            (destination / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, destination / name)
    return destination
