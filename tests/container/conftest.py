"""Fixtures for the container tests live in container_fixtures (importable by the tests too)."""

from container_fixtures import docker, docker_image, sif  # noqa: F401 - pytest fixtures
