"""A row of `distrain selftest`'s report: a check, its verdict and why (selftest.py and selftest_arithmetic.py)."""

from __future__ import annotations

from dataclasses import dataclass

PASS, FAIL, SKIP = "pass", "fail", "skip"


@dataclass(frozen=True)
class Row:
    check: str
    status: str
    detail: str
    seconds: float = 0.0
