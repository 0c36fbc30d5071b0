"""MultiWorkerMirroredStrategy from the TF_CONFIG that setup exported, with start-up checks.

TensorFlow turns a bad host name into a silent gRPC stall and a busy port into an abort on one worker while the
others wait forever; both are checked here first, in milliseconds, with a message naming the address.
"""

from __future__ import annotations

import json
import os
import socket
import threading

from ..errors import EXIT_ENVIRONMENT, EnvironmentProblem
from ..log import get as log
from ..plan import Plan

_IMPLEMENTATIONS = {"auto": "AUTO", "ring": "RING", "nccl": "NCCL"}


def _check_addresses(plan: Plan) -> None:
    workers = json.loads(os.environ["TF_CONFIG"])["cluster"]["worker"] if "TF_CONFIG" in os.environ else []
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
    try:
        probe.bind(("", int(port)))
    except OSError as exc:
        raise EnvironmentProblem(
            f"port {port} for rank {plan.rank} on {host} is unavailable ({exc.strerror}): another job uses it; "
            "set DISTRAIN_PORT_BASE to a free range"
        ) from None
    finally:
        probe.close()


def _start_watchdog(seconds: float) -> threading.Event:
    """Exit with a clear message when the workers never all join (missing worker, wrong world size)."""
    done = threading.Event()

    def watch() -> None:
        if not done.wait(seconds):
            log().error(
                f"the MWM workers did not all join within {seconds:.0f} s: "
                "a worker is missing or died, or the workers disagree on the cluster (DISTRAIN_START_TIMEOUT)"
            )
            os._exit(EXIT_ENVIRONMENT)

    threading.Thread(target=watch, name="distrain-start-watchdog", daemon=True).start()
    return done


def build(plan: Plan, tf):  # noqa: ANN001, ANN201 - tensorflow module in, strategy out
    _check_addresses(plan)
    implementation = getattr(tf.distribute.experimental.CommunicationImplementation, _IMPLEMENTATIONS[plan.collective])
    options = tf.distribute.experimental.CommunicationOptions(
        implementation=implementation,
        timeout_seconds=plan.collective_timeout,
    )
    joined = _start_watchdog(float(os.environ.get("DISTRAIN_START_TIMEOUT", "300")))
    try:
        strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    finally:
        joined.set()
    return strategy
