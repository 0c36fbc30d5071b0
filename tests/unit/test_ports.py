"""The ports `distrain launch` gives its workers: outside the ephemeral range, and held until the run ends (real
sockets, no TensorFlow)."""

import socket

from entrypoint.ports import ephemeral_range, port_free, reserved_ports
from entrypoint.slurm import SLURM_PORTS
from helpers import free_ports


def test_the_ports_are_free_and_where_no_outgoing_connection_or_slurm_run_takes_them():
    ports = free_ports(8)
    assert len(set(ports)) == 8
    for port in ports:
        assert port not in ephemeral_range(), f"{port} is in the ephemeral range {ephemeral_range()}"
        assert port not in SLURM_PORTS
        assert port_free(port)


def test_a_reserved_port_is_refused_to_another_launch_but_taken_by_a_server_as_grpc_binds():
    with reserved_ports(2) as ports:
        for port in ports:
            assert not port_free(port), "another launch could draw a port this one holds"
        with reserved_ports(64) as others:
            assert not set(others) & set(ports)
        grpc_like = socket.socket(socket.AF_INET, socket.SOCK_STREAM)  # gRPC's server sets SO_REUSEADDR
        grpc_like.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        grpc_like.bind(("", ports[0]))
        grpc_like.listen()
        with socket.create_connection(("localhost", ports[0]), timeout=5):
            pass
        grpc_like.close()
    assert all(port_free(port) for port in ports), "the ports were not given back when the run ended"
