"""Ports for local MWM workers (`distrain launch`), chosen where nothing else on the host takes them by chance.

A port the kernel hands out for `bind(:0)` lies in its ephemeral range, where any outgoing connection on the host
(another run's gRPC, pip, a browser) may take it as a source port in the seconds before the worker's gRPC server
binds it: a CI run lost that race (`port 39111 for rank 0 on localhost is unavailable`, with another test's
workers connecting beside it). So ports are drawn at random outside that range and outside the slots Slurm runs
derive (`slurm.port_base`), and the launcher holds them until the run ends: a second launch on the host cannot
draw them meanwhile, yet the worker's gRPC server can bind them (see `reserved_ports`).
"""

from __future__ import annotations

import contextlib
import random
import socket
from collections.abc import Iterator
from pathlib import Path

from .errors import ConfigError
from .slurm import SLURM_PORTS

_EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_LOWEST = 10000  # below: well-known and registered services


def ephemeral_range() -> range:
    """The kernel's ephemeral ports (32768-60999 unless an admin changed it)."""
    try:
        low, high = (int(part) for part in _EPHEMERAL_RANGE_FILE.read_text().split())
    except (OSError, ValueError):
        low, high = 32768, 60999
    return range(low, high + 1)


def candidate_ports() -> list[int]:
    """Ports no outgoing connection and no Slurm run of distrain's takes by chance."""
    ephemeral = ephemeral_range()
    return [p for p in range(_LOWEST, 65536) if p not in ephemeral and p not in SLURM_PORTS]


def _bound_alone(port: int) -> socket.socket | None:
    """A socket bound to `port` on every interface if nothing else is bound to it, else None. Bound without
    SO_REUSEADDR, so it fails on any socket there, listening or not (another launch's reservation included)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind(("", port))
    except OSError:
        sock.close()
        return None
    return sock


def port_free(port: int) -> bool:
    sock = _bound_alone(port)
    if sock is None:
        return False
    sock.close()
    return True


def _draw(count: int) -> list[socket.socket]:
    """`count` sockets, each bound alone to a free port drawn at random from `candidate_ports`."""
    candidates = candidate_ports()
    if len(candidates) < 16 * count:  # an admin gave nearly every port to the ephemeral range
        raise ConfigError(f"too few ports outside the ephemeral range {ephemeral_range()}: pass --port")
    held: list[socket.socket] = []
    for port in random.sample(candidates, min(len(candidates), 64 * count)):
        sock = _bound_alone(port)
        if sock is not None:
            held.append(sock)
            if len(held) == count:
                return held
    for sock in held:
        sock.close()
    raise ConfigError(f"no {count} free ports found outside the ephemeral range {ephemeral_range()}: pass --port")


@contextlib.contextmanager
def reserved_ports(count: int) -> Iterator[list[int]]:
    """Free ports, held until the block ends. Each is bound alone (which fails if anything is there), then marked
    SO_REUSEADDR and never listened on: Linux then refuses the port to any other bind without SO_REUSEADDR (another
    launch's draw), while gRPC, which sets SO_REUSEADDR, binds and listens on it."""
    held = _draw(count)
    try:
        for sock in held:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        yield [sock.getsockname()[1] for sock in held]
    finally:
        for sock in held:
            sock.close()
