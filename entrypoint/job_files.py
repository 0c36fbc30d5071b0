"""What a job of one of distrain's job files will be, told on the login node (`distrain plan --job-name NAME`):
the job file its name is (`#SBATCH --job-name=` in the header), the mode it runs, and the nodes and ranks its
header and the sbatch options given make. The login node's own environment says none of it: a plan made there
is `single` on its CPU."""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

HEADER = re.compile(r"^#SBATCH\s+--([\w-]+)(?:[= ](\S+))?", re.MULTILINE)
# the mode each job file runs (the argument it gives jobs/lib.sh's distrain_job); a file not here runs no training
MODES = {"mwm": "mwm", "horovod": "horovod", "single": "single", "mirrored": "mirrored", "selftest": "selftest"}


@dataclass(frozen=True)
class JobShape:
    name: str
    job_file: str
    mode: str
    nodes: int
    tasks_per_node: int

    @property
    def ranks(self) -> int:
        return self.nodes * self.tasks_per_node if self.mode in ("mwm", "horovod", "selftest") else 1

    def line(self) -> str:
        if self.mode in ("single", "mirrored"):
            what = "one process on one GPU" if self.mode == "single" else "one process on all the node's GPUs"
            return f"job {self.name} ({self.job_file}): mode {self.mode}, {what}"
        return (f"job {self.name} ({self.job_file}): mode {self.mode}, {self.nodes} node(s) x {self.tasks_per_node} "
                f"task(s) = {self.ranks} ranks, one GPU each (its header, and the --nodes/--ntasks-per-node given)")

    def to_dict(self) -> dict:
        return {"name": self.name, "job_file": self.job_file, "mode": self.mode, "nodes": self.nodes,
                "tasks_per_node": self.tasks_per_node, "ranks": self.ranks}


def headers(checkout: str) -> dict[str, dict[str, str]]:
    """Each job file's #SBATCH options, by its job name."""
    found = {}
    for path in sorted(glob.glob(os.path.join(checkout, "jobs", "*.job"))):
        with open(path, encoding="utf-8", errors="replace") as handle:
            options = {m[1]: m[2] or "" for m in HEADER.finditer(handle.read())}
        if options.get("job-name"):
            found[options["job-name"]] = {**options, "file": os.path.relpath(path, checkout)}
    return found


def checkout(env: Mapping[str, str], cwd: str) -> str | None:
    """The distrain checkout whose job files a job runs: $DISTRAIN_HOME, $DISTRAIN (the README's), the one this
    package is in, the working directory; None where none has jobs/lib.sh."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for place in filter(None, (env.get("DISTRAIN_HOME"), env.get("DISTRAIN"), here, cwd)):
        if os.path.isfile(os.path.join(place, "jobs", "lib.sh")):
            return place
    return None


def job_shape(name: str, checkout: str | None, nodes: int | None = None,
              tasks_per_node: int | None = None) -> JobShape | str:
    """The job that `name` is, with the sbatch options given; or one line on why it cannot be known."""
    known = headers(checkout) if checkout else {}
    header = known.get(name)
    if header is None:
        names = ", ".join(known) or "none found: set DISTRAIN_HOME to the distrain checkout"
        return (f"job {name}: not the name of one of distrain's job files ({names}), so its mode, nodes and ranks "
                "cannot be known here; the rows below are this login node's")
    mode = MODES.get(os.path.splitext(os.path.basename(header["file"]))[0], "")
    if not mode:
        return f"job {name} ({header['file']}) trains nothing: it builds or checks"
    header_tasks = header.get("ntasks-per-node") or header.get("ntasks") or "1"
    return JobShape(name, header["file"], mode, nodes or int(header.get("nodes") or 1),
                    tasks_per_node or int(header_tasks))


def for_plan(name: str, env: Mapping[str, str], cwd: str, nodes: int | None,
             tasks_per_node: int | None) -> tuple[str, dict | str]:
    """`distrain plan --job-name`'s first line and its JSON: the job's shape, or why it cannot be known."""
    shape = job_shape(name, checkout(env, cwd), nodes, tasks_per_node)
    if isinstance(shape, str):
        return shape, shape
    return (f"{shape.line()}; the rows below are this login node's, but for the run, its directory and where it "
            "resumes"), shape.to_dict()
