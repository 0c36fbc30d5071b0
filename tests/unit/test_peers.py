"""Telling a lost peer from a bug in the script (peers), with real sockets for the liveness probe."""

import json
import socket
import threading
import time

from entrypoint.peers import lost_peer, unreachable
from entrypoint.plan import detect


class UnavailableError(Exception):
    """Stands in for tf.errors.UnavailableError: the classification goes by type name and message."""


def mwm_plan(addresses, rank=0):
    config = {"cluster": {"worker": addresses}, "task": {"type": "worker", "index": rank}}
    return detect({"TF_CONFIG": json.dumps(config)}, gpus=[])


def test_a_closed_port_is_unreachable_and_an_open_one_is_not():
    with socket.socket() as alive, socket.socket() as dead:
        alive.bind(("127.0.0.1", 0))
        alive.listen()
        dead.bind(("127.0.0.1", 0))  # bound, not listening: refuses like a dead process's port
        peers = [(1, f"127.0.0.1:{alive.getsockname()[1]}"), (2, f"127.0.0.1:{dead.getsockname()[1]}")]
        assert unreachable(peers) == [peers[1]]


def test_heartbeat_failure_names_the_dead_worker():
    with socket.socket() as me, socket.socket() as dead:
        me.bind(("127.0.0.1", 0))
        dead.bind(("127.0.0.1", 0))
        addresses = [f"127.0.0.1:{me.getsockname()[1]}", f"127.0.0.1:{dead.getsockname()[1]}"]
        plan = mwm_plan(addresses)
        exc = UnavailableError("Collective ops is aborted by: Task /job:worker/replica:0/task:1 heartbeat timeout")
        line = lost_peer(exc, plan, plan.cluster)
    assert line.startswith(f"lost worker 1 ({addresses[1]})") and "or a rerun resumes from the last checkpoint" in line


def test_the_scripts_own_errors_are_not_a_lost_peer():
    plan = mwm_plan(["127.0.0.1:1", "127.0.0.1:2"])
    assert lost_peer(ValueError("heartbeat of my model"), plan, plan.cluster) is None  # wrong type
    assert lost_peer(UnavailableError("my dataset server is down"), plan, plan.cluster) is None  # wrong message
    single = detect({}, gpus=[])
    assert lost_peer(UnavailableError("Socket closed"), single, ()) is None  # nobody to lose


def test_a_peer_still_closing_its_port_is_named_once_it_is_gone():
    """A SIGKILLed peer closes its collective's socket before its liveness port: the probe waits for it."""
    exc = UnavailableError("Horovod has been shut down. [[{{node distrain_grads}}]]")
    for patience, named in ((0.0, False), (3.0, True)):  # without patience the dying peer still answers
        with socket.socket() as me, socket.socket() as dying:
            me.bind(("127.0.0.1", 0))
            dying.bind(("127.0.0.1", 0))
            dying.listen()
            addresses = [f"127.0.0.1:{me.getsockname()[1]}", f"127.0.0.1:{dying.getsockname()[1]}"]
            plan = mwm_plan(addresses)
            closing = threading.Timer(0.5, dying.close)
            closing.start()
            started = time.monotonic()
            line = lost_peer(exc, plan, plan.cluster, patience=patience)
            closing.join()
        assert (line is not None) == named, (patience, line)
        if named:
            assert line.startswith(f"lost worker 1 ({addresses[1]})") and time.monotonic() - started < 1.5


def test_a_collective_error_with_every_peer_alive_is_the_scripts_after_the_patience():
    with socket.socket() as me, socket.socket() as alive:
        me.bind(("127.0.0.1", 0))
        alive.bind(("127.0.0.1", 0))
        alive.listen()
        plan = mwm_plan([f"127.0.0.1:{me.getsockname()[1]}", f"127.0.0.1:{alive.getsockname()[1]}"])
        started = time.monotonic()
        assert lost_peer(UnavailableError("Socket closed"), plan, plan.cluster, patience=0.5) is None
        assert time.monotonic() - started >= 0.5
