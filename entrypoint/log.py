"""Rank-prefixed logging: every line distrain prints says which process wrote it."""

from __future__ import annotations

import logging
import os
import sys

_LOGGER = logging.getLogger("distrain")


def configure(prefix: str) -> logging.Logger:
    """Send distrain's messages to stderr as '[rank/size] distrain: message'."""
    _LOGGER.handlers.clear()
    handler = logging.StreamHandler(sys.stderr)
    # under `distrain launch` the launcher already prefixes every line of the worker's output
    prefix = "" if os.environ.get("DISTRAIN_LAUNCHER") else f"{prefix} "
    handler.setFormatter(logging.Formatter(f"{prefix}distrain: %(message)s"))
    _LOGGER.addHandler(handler)
    _LOGGER.setLevel(logging.INFO)
    _LOGGER.propagate = False
    return _LOGGER


def get() -> logging.Logger:
    return _LOGGER
