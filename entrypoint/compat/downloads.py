"""`keras.utils.get_file` under ranks: one process per cache downloads and extracts, the others wait and read.

Every rank runs the script, so every rank calls `get_file` (directly, or through `keras.datasets.*.load_data` and
`keras.applications`' weights) into one cache, `~/.keras/datasets` on a shared home. Keras extracts an archive
at every call: a rank reading the extracted files while another extracts them again fails
(`NotFoundError: Could not find directory .../aclImdb/train`; plain Keras in two processes fails the same).
Here the calls into one cache take turns under a file lock; the first of this launch runs Keras' own `get_file`
and records what it returned; the others, finding that record (same arguments, same launch, the path still
there), return it without extracting again. A rank waits at most DOWNLOAD_WAIT_SECONDS, then says who holds the
lock. A download that fails for want of network (a compute node) is one line naming the file and how to fetch it
on the login node, where a later run finds it in the cache.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import inspect
import json
import os
import socket
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

from ..errors import EnvironmentProblem
from . import registry

DOWNLOAD_WAIT_SECONDS = 3600.0  # how long a rank waits for another's download and extraction into its cache
POLL_SECONDS = 0.5
LOCK_FILE = ".distrain-get-file.lock"
RECORD_FILE = ".distrain-get-file.json"
_FETCH_FAILURE = "URL fetch failure on "  # how Keras 3 and tf_keras word a download that could not be made


def install(spelled: str, package: str, launch: str) -> bool:
    """Make the family's get_file (KerasFamily.get_file) and every loaded `package` module's reference to it take
    turns per cache; `launch`: what this launch's ranks share and the next launch does not (its record's key)."""
    replaced: dict[str, Callable] = {}

    def taking_turns(original: Callable) -> Callable:
        signature = inspect.signature(original)

        @functools.wraps(original)
        def get_file(*args: Any, **kwargs: Any) -> Any:
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            return once_per_cache(original, bound, launch, package)

        replaced.update(original=original, replacement=get_file)
        return get_file

    found = registry.replace(("downloads.keras3_get_file", "downloads.tf_keras_get_file"), spelled, taking_turns)
    if found is not None and replaced:
        _rebind_loaders(package, found.attribute, replaced["original"], replaced["replacement"])
    return found is not None


def _rebind_loaders(package: str, attribute: str, original: Callable, replacement: Callable) -> None:
    """The loaders that imported get_file by name (keras.datasets.mnist) call the replacement too."""
    # patch: downloads.keras3_get_file
    # patch: downloads.tf_keras_get_file
    for name, module in list(sys.modules.items()):
        if name.startswith(package) and getattr(module, attribute, None) is original:
            setattr(module, attribute, replacement)


def once_per_cache(original: Callable, bound: inspect.BoundArguments, launch: str, package: str) -> Any:
    """Keras' get_file, run by the first rank of this launch to ask for these arguments; the others get its path."""
    arguments = bound.arguments
    cache = cache_directory(arguments.get("cache_dir"), arguments.get("cache_subdir") or "datasets")
    key = hashlib.sha256(json.dumps([launch, sorted((k, repr(v)) for k, v in arguments.items())]).encode())
    key_text = key.hexdigest()[:32]
    with _turn(os.path.join(cache, LOCK_FILE), cache):
        records = _read(os.path.join(cache, RECORD_FILE))
        done = records.get(key_text)
        if done is not None and os.path.exists(done) and not arguments.get("force_download"):
            return done
        try:
            path = original(*bound.args, **bound.kwargs)
        except Exception as exc:  # noqa: BLE001 - Keras raises a bare Exception for a failed fetch
            if str(exc).startswith(_FETCH_FAILURE):
                raise EnvironmentProblem(_no_network(arguments, exc, package)) from None
            raise
        records[key_text] = str(path)
        _write(os.path.join(cache, RECORD_FILE), records)
        return path


def cache_directory(cache_dir: Any, cache_subdir: str) -> str:
    """Where Keras' get_file puts its files: `cache_dir` (KERAS_HOME, else ~/.keras) / `cache_subdir`."""
    base = os.fspath(cache_dir) if cache_dir else os.environ.get("KERAS_HOME") or os.path.join(
        os.path.expanduser("~"), ".keras")
    directory = os.path.join(base, cache_subdir) if not os.path.isabs(cache_subdir) else cache_subdir
    os.makedirs(directory, exist_ok=True)
    return directory


@contextlib.contextmanager
def _turn(lock_path: str, cache: str) -> Iterator[None]:
    """This process's turn at the cache: an exclusive lock, waited for at most DOWNLOAD_WAIT_SECONDS."""
    with open(os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600), "r+") as lock:
        deadline = time.monotonic() + DOWNLOAD_WAIT_SECONDS
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    lock.seek(0)
                    holder = lock.read().strip() or "another process"
                    raise EnvironmentProblem(
                        f"waited {DOWNLOAD_WAIT_SECONDS:.0f} s for {holder}'s download into {cache}: end it, or "
                        f"download the file once on the login node") from None
                time.sleep(POLL_SECONDS)
            except OSError:  # a file system without locks (some Lustre mounts): every rank on its own, as Keras
                break
        lock.seek(0)
        lock.truncate()
        lock.write(f"pid {os.getpid()} on {socket.gethostname()}")
        lock.flush()
        try:
            yield
        finally:
            with contextlib.suppress(OSError):
                lock.truncate(0)
                fcntl.flock(lock, fcntl.LOCK_UN)


def _read(path: str) -> dict[str, str]:
    try:
        with open(path) as handle:
            return dict(json.load(handle))
    except (OSError, ValueError, TypeError):
        return {}


def _write(path: str, records: dict[str, str]) -> None:
    temporary = f"{path}.{os.getpid()}"
    with open(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as handle:
        json.dump(records, handle)
    os.replace(temporary, path)


def _no_network(arguments: dict, exc: Exception, package: str) -> str:
    origin, name = arguments.get("origin"), arguments.get("fname")
    reason = str(exc).rsplit(" -- ", 1)[-1]
    again = ", ".join(f"{k}={arguments[k]!r}" for k in ("fname", "origin", "extract", "cache_dir", "cache_subdir")
                      if arguments.get(k) not in (None, False))
    return (f"could not download {name or origin} from {origin} ({reason}): compute nodes often have no network; "
            f"fetch it once on the login node into the same cache: python -c \"import {package}; "
            f"{package}.utils.get_file({again})\"")
