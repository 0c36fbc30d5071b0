"""Recompute the overhead rows of results files from the passes they keep, with ratios.py's current estimator.

    .venv/bin/python benchmarks/summarize.py benchmarks/results/overhead*.json

For when the way a row is summarized changes (2026-11-27: the median of the paired per-repetition ratios instead of
the ratio of the medians), so that every committed figure comes from its own passes by the same code. Rows without
passes (results older than 2026-11-26) are left as written and named; so is the throughput of passes that did not
keep it (before 2026-11-27), which the row then says (`throughput_summary`).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ratios import overhead_row


def summarize(path: Path) -> tuple[int, list[str]]:
    """Rewrite the overhead rows of one results file from their passes; return how many, and the names of the rows
    left as written."""
    results = json.loads(path.read_text())
    rows = results.get("overhead", {})
    left = [name for name, row in rows.items() if not row.get("passes")]
    for row in (row for row in rows.values() if row.get("passes")):
        new = overhead_row(row["passes"])
        if "ratio" not in new:
            new["throughput_summary"] = "ratio of the medians, as first written (the passes kept no throughput)"
        row.update(new)
    if len(left) < len(rows):
        path.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    return len(rows) - len(left), left


def main() -> int:
    if len(sys.argv) < 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    for arg in sys.argv[1:]:
        rewritten, left = summarize(Path(arg))
        print(f"{arg}: {rewritten} row(s) from their passes"
              + (f"; left as written (no passes): {', '.join(left)}" if left else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
