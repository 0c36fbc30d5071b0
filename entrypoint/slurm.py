"""Slurm step variables → the list of workers, without TensorFlow's SlurmClusterResolver.

Hand-written on purpose: TF's resolver sorts hosts as strings (`n10` before `n9`), gives every node the same
`port_base + local index` (two jobs, or emulated nodes on one host, collide), divides by zero with one GPU per
task, and shells out to `nvidia-smi`. `python-hostlist` would expand host lists, but it is one small function
and not worth a dependency inside every image; the layout and port logic is ours anyway.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Mapping
from dataclasses import dataclass

from .errors import ConfigError

_RANGE_GROUP = re.compile(r"\[([^\]]*)\]")


def _split_top_level(text: str) -> list[str]:
    """Split on commas that are not inside brackets: 'a[1-2]-ib,b3' -> ['a[1-2]-ib', 'b3']."""
    parts, depth, current = [], 0, []
    for char in text:
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise ConfigError(f"malformed Slurm host list {text!r}: unbalanced ']'")
        if char == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    if depth != 0:
        raise ConfigError(f"malformed Slurm host list {text!r}: unbalanced '['")
    parts.append("".join(current))
    return [p for p in (s.strip() for s in parts) if p]


def _expand_ranges(body: str, text: str) -> list[str]:
    """'1-3,7' -> ['1','2','3','7'], keeping zero padding ('001-010')."""
    out: list[str] = []
    for item in body.split(","):
        item = item.strip()
        if re.fullmatch(r"\d+", item):
            out.append(item)
            continue
        match = re.fullmatch(r"(\d+)-(\d+)", item)
        if not match:
            raise ConfigError(f"malformed Slurm host list {text!r}: bad range {item!r}")
        lo, hi = match.groups()
        if int(hi) < int(lo):
            raise ConfigError(f"malformed Slurm host list {text!r}: range {item!r} runs backwards")
        width = len(lo) if lo.startswith("0") and len(lo) > 1 else 0
        out.extend(str(i).zfill(width) for i in range(int(lo), int(hi) + 1))
    return out


def expand_hostlist(text: str) -> list[str]:
    """Expand a Slurm host list in Slurm's own order: 'n[9-10]' -> ['n9', 'n10'] (never string-sorted)."""
    hosts: list[str] = []
    for part in _split_top_level(text):
        names = [""]
        pos = 0
        for match in _RANGE_GROUP.finditer(part):
            prefix = part[pos : match.start()]
            values = _expand_ranges(match.group(1), text)
            names = [n + prefix + v for n in names for v in values]
            pos = match.end()
        names = [n + part[pos:] for n in names]
        hosts.extend(names)
    return hosts


def expand_tasks_per_node(text: str) -> list[int]:
    """'2(x3),1' -> [2, 2, 2, 1] (the format of SLURM_STEP_TASKS_PER_NODE)."""
    counts: list[int] = []
    for item in text.split(","):
        match = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", item)
        if not match:
            raise ConfigError(f"malformed SLURM_STEP_TASKS_PER_NODE {text!r}: expected e.g. '2(x3),1'")
        counts.extend([int(match.group(1))] * int(match.group(2) or 1))
    return counts


@dataclass(frozen=True)
class SlurmStep:
    """One task's view of its Slurm job step."""

    job_id: int
    step_id: int
    restart: int
    hosts: tuple[str, ...]
    tasks_per_node: tuple[int, ...]
    rank: int
    node_id: int
    local_id: int
    distribution: str

    @property
    def size(self) -> int:
        return sum(self.tasks_per_node)

    def task_layout(self) -> list[tuple[int, int]]:
        """(node index, task index on that node) for every global rank, in rank order."""
        if self.distribution == "block":
            return [(node, local) for node, count in enumerate(self.tasks_per_node) for local in range(count)]
        # cyclic: one task to each node that still has room, round after round (Slurm's definition)
        layout, placed = [], [0] * len(self.tasks_per_node)
        while len(layout) < self.size:
            for node, count in enumerate(self.tasks_per_node):
                if placed[node] < count:
                    layout.append((node, placed[node]))
                    placed[node] += 1
        return layout


_REQUIRED = object()
SLURM_CORRUPT = ": the Slurm environment is corrupt"


def int_var(env: Mapping[str, str], name: str, default: object = _REQUIRED, hint: str = "") -> int | None:
    """An integer environment variable: `default` when unset (required when no default is given), and a
    ConfigError naming the variable when it is not a number. The one parser for Slurm's and distrain's own."""
    value = env.get(name)
    if value is None or value == "":
        if default is _REQUIRED:
            raise ConfigError(f"{name} is not set inside a Slurm step: run the script under srun")
        return default  # type: ignore[return-value]
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"{name}={value!r} is not a number{hint}") from None


def read_step(env: Mapping[str, str]) -> SlurmStep:
    """Read and cross-check the step variables; refuse a layout that cannot be computed."""
    nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    tasks = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE")
    if not nodelist or not tasks:
        raise ConfigError("SLURM_STEP_NODELIST/SLURM_STEP_TASKS_PER_NODE are not set: launch each task with srun")
    hosts = expand_hostlist(nodelist)
    counts = expand_tasks_per_node(tasks)
    if len(hosts) != len(counts):
        raise ConfigError(
            f"inconsistent Slurm variables: {len(hosts)} nodes in {nodelist!r} but "
            f"{len(counts)} task counts in {tasks!r}"
        )
    dist_raw = (env.get("SLURM_DISTRIBUTION") or "block").lower()
    node_dist = dist_raw.split(":")[0].split(",")[0]
    if node_dist in ("", "block", "unknown"):
        distribution = "block"
    elif node_dist == "cyclic":
        distribution = "cyclic"
    else:
        raise ConfigError(
            f"SLURM_DISTRIBUTION={dist_raw!r}: distrain can place tasks only for 'block' and 'cyclic'; "
            "use srun --distribution=block or set TF_CONFIG yourself"
        )
    step = SlurmStep(
        job_id=int_var(env, "SLURM_JOB_ID", 0, SLURM_CORRUPT),
        step_id=int_var(env, "SLURM_STEP_ID", 0, SLURM_CORRUPT) if env.get("SLURM_STEP_ID", "").isdigit() else 0,
        restart=int_var(env, "SLURM_RESTART_COUNT", 0, SLURM_CORRUPT),
        hosts=tuple(hosts),
        tasks_per_node=tuple(counts),
        rank=int_var(env, "SLURM_PROCID", hint=SLURM_CORRUPT),
        node_id=int_var(env, "SLURM_NODEID", 0, SLURM_CORRUPT),
        local_id=int_var(env, "SLURM_LOCALID", 0, SLURM_CORRUPT),
        distribution=distribution,
    )
    declared = env.get("SLURM_STEP_NUM_TASKS") or env.get("SLURM_NTASKS")
    if declared and declared.isdigit() and int(declared) != step.size:
        raise ConfigError(
            f"inconsistent Slurm variables: SLURM_STEP_NUM_TASKS={declared} but "
            f"SLURM_STEP_TASKS_PER_NODE={tasks!r} adds up to {step.size}"
        )
    if not 0 <= step.rank < step.size:
        raise ConfigError(f"inconsistent Slurm variables: SLURM_PROCID={step.rank} outside 0..{step.size - 1}")
    expected = step.task_layout()[step.rank]
    if expected != (step.node_id, step.local_id):
        raise ConfigError(
            f"inconsistent Slurm variables: rank {step.rank} should be task {expected[1]} on node "
            f"{hosts[expected[0]]} for a {distribution} layout, but SLURM_NODEID={step.node_id} "
            f"SLURM_LOCALID={step.local_id}; use srun --distribution=block or set TF_CONFIG yourself"
        )
    return step


# below Linux's ephemeral range (32768-60999 by default), where any outgoing connection may take a port
SLURM_PORTS = range(20000, 32768)


def port_base(step: SlurmStep, world_size: int, configured: str | None) -> int:
    """First port of this step: DISTRAIN_PORT_BASE, or a slot derived from the job and step id.

    Each rank then uses `base + rank`, so ports are distinct per host even when several emulated nodes (or
    tasks of one job) share a host; two jobs on one node, and a requeued run of the same job, get different
    slots unless their ids collide modulo the number of slots.
    """
    if configured:
        try:
            base = int(configured)
        except ValueError:
            raise ConfigError(f"DISTRAIN_PORT_BASE={configured!r} is not a port number") from None
        if not 1024 <= base <= 65535 - world_size:
            raise ConfigError(f"DISTRAIN_PORT_BASE={base} leaves no room for {world_size} ports below 65536")
        return base
    slot = 64
    while slot < world_size:
        slot *= 2
    first, last = SLURM_PORTS.start, SLURM_PORTS.stop
    slots = (last - first) // slot
    key = zlib.crc32(f"{step.job_id}.{step.step_id}.{step.restart}".encode())  # a requeued run moves on
    return first + (key % slots) * slot


def worker_addresses(step: SlurmStep, base: int) -> list[str]:
    """host:port of every rank, in rank order."""
    return [f"{step.hosts[node]}:{base + rank}" for rank, (node, _) in enumerate(step.task_layout())]
