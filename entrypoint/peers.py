"""A lost peer is a distrain error, not a bug in the user's script.

When another worker dies, the survivors fail inside a collective: TensorFlow reports a heartbeat timeout, an
unavailable peer or an aborted collective; Horovod reports that it was shut down or that a connection closed.
The Python exception that surfaces in `train.py` looks like a crash of the script (a 40-70 line traceback, exit
1). `lost_peer(exc, plan)` recognises those failures and names the lost worker, so the CLI prints one line and
exits with EXIT_WORKER_FAILED (4), the code `distrain launch` uses for a dead worker.

The worker is named by probing the cluster's addresses (a dead process's port refuses connections) and, where
TensorFlow's message names a task (`/job:worker/replica:0/task:N`), by that task.
"""

from __future__ import annotations

import re
import socket
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

from .plan import Plan

PROBE_PATIENCE_SECONDS = 3.0  # a dying peer may close its collective's socket a moment before its probe port

# Messages of the failures a dead peer causes, TensorFlow's and Horovod's (checked on 2.17 and 2.21, Gloo/MPI).
_LOSS = re.compile(
    r"heartbeat|Collective ops is aborted|coordination service|is unavailable|Socket closed|Connection reset"
    r"|Connection refused|failed to connect|Connection closed by peer|Broken pipe|Horovod has been shut down"
    r"|HorovodInternalError|ring_reader|peer .* (?:closed|lost)|Read error|UNAVAILABLE|Failed to connect|"
    r"the cluster is unhealthy|task .* disconnected",
    re.IGNORECASE,
)
_TASK = re.compile(r"/job:(?:worker|chief)/replica:\d+/task:(\d+)")
_ERROR_TYPES = ("UnavailableError", "AbortedError", "CancelledError", "DeadlineExceededError", "InternalError",
                "UnknownError", "FailedPreconditionError", "HorovodInternalError")


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def _looks_like_loss(exc: BaseException) -> bool:
    return any(type(e).__name__ in _ERROR_TYPES and _LOSS.search(str(e)) for e in _chain(exc))


def unreachable(addresses: list[tuple[int, str]], timeout: float = 2.0) -> list[tuple[int, str]]:
    """The (rank, host:port) whose port does not accept a connection: the process is gone (or its node)."""

    def gone(address: str) -> bool:
        host, port = address.rsplit(":", 1)
        try:
            with socket.create_connection((host, int(port)), timeout=timeout):
                return False
        except OSError:
            return True

    with ThreadPoolExecutor(max_workers=min(32, max(1, len(addresses)))) as pool:  # a dead node times out
        verdicts = list(pool.map(gone, [address for _, address in addresses]))
    return [peer for peer, dead in zip(addresses, verdicts) if dead]


def first_unreachable(addresses: list[tuple[int, str]], patience: float) -> list[tuple[int, str]]:
    """`unreachable`, probed again for up to `patience` seconds while every peer still answers.

    A SIGKILLed process closes its descriptors one by one: the survivor can hear its collective's socket close
    and reach the probe before the dying process has closed its liveness port (seen once in 14 under CI load:
    the survivor printed a traceback instead of naming the lost worker)."""
    deadline = time.monotonic() + patience
    while True:
        lost = unreachable(addresses)
        if lost or time.monotonic() >= deadline:
            return lost
        time.sleep(0.1)


def lost_peer(exc: BaseException, plan: Plan, addresses: tuple[str, ...],
              patience: float = PROBE_PATIENCE_SECONDS) -> str | None:
    """One line naming the lost worker if `exc` is the failure a dead peer causes, else None.

    `addresses`: host:port per rank that accepts connections while that rank lives (the MWM cluster, or the
    ports the Horovod engine opened). `patience`: how long a dying peer may take to close its port."""
    if plan.size < 2 or not _looks_like_loss(exc):  # one process (single, mirrored): no peer to lose
        return None
    text = " ".join(str(e) for e in _chain(exc))
    named = sorted({int(t) for t in _TASK.findall(text)} - {plan.rank})
    peers = [(r, a) for r, a in enumerate(addresses) if r != plan.rank]
    if peers:  # evidence, not the message alone: a collective mismatch from a bug reads much the same
        lost = first_unreachable(peers, patience)
        if not lost:
            return None
        who = ", ".join(f"worker {r} ({a})" for r, a in lost)
    elif named:
        who = ", ".join(f"worker {r}" for r in named)
    else:
        return None
    return (f"lost {who}: it died or became unreachable, so worker {plan.rank} stopped too; "
            "a restart (distrain launch, the job scripts) or a rerun resumes from the last checkpoint")
