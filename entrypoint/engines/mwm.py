"""MultiWorkerMirroredStrategy from the TF_CONFIG that setup exported, with start-up checks.

TensorFlow turns a bad host name into a silent gRPC stall and a busy port into an abort on one worker while the
others wait forever; both are checked here first, in milliseconds, with a message naming the address.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys

from ..errors import EnvironmentProblem
from ..plan import Plan

_IMPLEMENTATIONS = {"auto": "AUTO", "ring": "RING", "nccl": "NCCL"}


def _check_addresses(plan: Plan) -> None:
    workers = plan.cluster
    for address in workers:
        host = address.rsplit(":", 1)[0]
        try:
            socket.getaddrinfo(host, None)
        except OSError:
            raise EnvironmentProblem(
                f"worker host {host!r} (from {address}) does not resolve: fix the node name or /etc/hosts"
            ) from None
    if not workers:
        return
    host, port = workers[plan.rank].rsplit(":", 1)
    probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC does: TIME_WAIT leftovers are fine
    try:
        probe.bind(("", int(port)))
    except OSError as exc:
        raise EnvironmentProblem(
            f"port {port} for rank {plan.rank} on {host} is unavailable ({exc.strerror}): another job uses it; "
            "set DISTRAIN_PORT_BASE to a free range"
        ) from None
    finally:
        probe.close()


_WATCHDOG = """
import os, select, signal, sys
ready, _, _ = select.select([int(sys.argv[1])], [], [], float(sys.argv[2]))
if not ready:
    import socket
    missing = []
    for rank, address in enumerate(sys.argv[5:]):
        host, port = address.rsplit(":", 1)
        try:
            socket.create_connection((host, int(port)), timeout=2).close()
        except OSError:
            missing.append(f"rank {rank} ({address})")
    said = ": not listening: " + ", ".join(missing) if missing else ""
    sys.stderr.write(sys.argv[4].replace("{missing}", said) + "\\n")
    os.kill(int(sys.argv[3]), signal.SIGKILL)
"""


def _start_watchdog(seconds: float, prefix: str, cluster: tuple[str, ...]) -> int:
    """Kill this process with a clear message if the workers never all join (missing worker, wrong world size),
    naming the workers whose port nobody listens on (never started, or their node is down).

    A separate process, not a thread: TensorFlow waits for the cluster inside a C++ call that keeps the GIL, so
    a Python thread never gets to run. Closing the returned fd (or this process dying) releases the watchdog.
    It costs 6 ms of CPU, not 20: no site packages (-S), and socket only imported when the workers never joined.
    """
    read_fd, write_fd = os.pipe()
    message = (
        f"{prefix} distrain: error: the MWM workers did not all join within {seconds:.0f} s{{missing}}; a worker "
        "is missing or died, or the workers disagree on the cluster (DISTRAIN_START_TIMEOUT)"
    )
    subprocess.Popen(
        [sys.executable, "-S", "-c", _WATCHDOG, str(read_fd), str(seconds), str(os.getpid()), message, *cluster],
        pass_fds=(read_fd,), stdin=subprocess.DEVNULL, start_new_session=True,
    )
    os.close(read_fd)
    return write_fd


def build(plan: Plan, tf, strategy_class: type):  # noqa: ANN001, ANN201 - tensorflow module in, strategy out
    """A strategy_class (MultiWorkerMirroredStrategy or its subclass: engines._distributing) of the plan's cluster."""
    _check_addresses(plan)
    implementation = getattr(tf.distribute.experimental.CommunicationImplementation, _IMPLEMENTATIONS[plan.collective])
    options = tf.distribute.experimental.CommunicationOptions(
        implementation=implementation,
        timeout_seconds=plan.collective_timeout,
    )
    joined = _start_watchdog(plan.start_timeout, plan.prefix, plan.cluster)
    try:
        strategy = strategy_class(communication_options=options)
    finally:
        os.close(joined)
    return strategy
