"""The benchmark suites, one module each, each entered as `run(options) -> dict` (the table: benchmarks/run.py)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Options:
    """What benchmarks/run.py's command line gives every suite."""

    reps: int
    smoke: bool
    only: str = ""  # overhead: only the rows whose name holds it
    one_after_other: bool = False  # overhead: every row one side at a time, a worker to a core
    sif: str | None = None  # container: the image
