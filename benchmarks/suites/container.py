"""container: apptainer run (the image) against the same work in the host venv."""

from __future__ import annotations

import os
import shutil
import statistics

from harness import DISTRAIN, ROOT, WORKLOAD, alternate, bench_line

from . import Options


def run(options: Options) -> dict:
    reps, smoke, sif = options.reps, options.smoke, options.sif
    apptainer = shutil.which("apptainer") or shutil.which("apptainer", path="/opt/distrain-apptainer/bin")
    if not sif or not os.path.isfile(sif) or not apptainer:
        return {"skipped": f"no image ({sif}) or no apptainer: build one with `distrain image build`"}
    work = ["--steps", "8" if smoke else "150", "--warmup", "3" if smoke else "20"]
    extra = {"APPTAINER_DROP_CAPS": "CAP_SYS_RESOURCE"} if os.geteuid() == 0 else {}
    samples = alternate({
        "apptainer": lambda: bench_line([apptainer, "run", "--env", "DISTRAIN_REQUIRE_GPU=0", "--bind", str(ROOT),
                                         sif, WORKLOAD, *work], extra_env=extra),
        "host venv": lambda: bench_line([DISTRAIN, "run", WORKLOAD, *work]),
    }, reps)
    ours = statistics.median(r["images_per_sec"] for r, _ in samples["apptainer"])
    host = statistics.median(r["images_per_sec"] for r, _ in samples["host venv"])
    return {"apptainer_images_per_sec": ours, "host_images_per_sec": host, "ratio": ours / host}

