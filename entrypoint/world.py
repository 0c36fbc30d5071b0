"""Who this process is among the workers and what started them: the mode, the ranks, the MWM cluster (for the
Plan: plan.py). From the launchers' own variables: horovodrun, Open MPI, PMI/PMIx, TF_CONFIG, a Slurm step."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from . import slurm
from .errors import ConfigError

MODES = ("single", "mirrored", "mwm", "horovod")

# Launch variables of MPI / PMI / horovodrun: (rank, size, local rank, local size), first match wins.
_LAUNCH_VARS = (
    ("horovodrun", ("HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE")),
    ("mpirun (Open MPI)", ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                           "OMPI_COMM_WORLD_LOCAL_SIZE")),
    ("PMIx", ("PMIX_RANK", "SLURM_NTASKS", "SLURM_LOCALID", None)),
    ("PMI", ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS")),
)


def slurm_step_tasks(env: Mapping[str, str]) -> int:
    """Number of tasks of the enclosing srun step (0 outside one). The batch script itself is a 1-task step."""
    if "SLURM_PROCID" not in env or "SLURM_STEP_ID" not in env:
        return 0
    raw = env.get("SLURM_STEP_NUM_TASKS") or "1"
    return int(raw) if raw.isdigit() else 0


def _launch_vars(env: Mapping[str, str]) -> tuple[str, str, tuple[int, int, int, int | None]] | None:
    """(launcher, the variable that gave it away, (rank, size, local rank, local size or None)), or None."""
    for launcher, names in _LAUNCH_VARS:
        if env.get(names[0]) in (None, ""):
            continue
        values = [slurm.int_var(env, n, None) if n else None for n in names]
        rank = values[0]
        size = values[1] if values[1] is not None else 1
        local = values[2] if values[2] is not None else 0
        return launcher, names[0], (rank, size, local, values[3])
    return None


def _parse_tf_config(raw: str) -> tuple[list[str], int]:
    try:
        config = json.loads(raw)
        workers = list(config["cluster"]["worker"])
        task = config["task"]
        index = int(task["index"])
        task_type = task["type"]
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ConfigError(
            f"TF_CONFIG is not valid ({exc.__class__.__name__}: {exc}); expected "
            '{"cluster": {"worker": ["host:port", ...]}, "task": {"type": "worker", "index": N}}'
        ) from None
    if set(config["cluster"]) - {"worker", "chief"} or task_type not in ("worker", "chief"):
        raise ConfigError("TF_CONFIG describes a parameter-server cluster: distrain runs worker-only MWM")
    if "chief" in config["cluster"]:
        chief = list(config["cluster"]["chief"])
        index = index if task_type == "chief" else index + len(chief)
        workers = chief + workers
    if not workers or not 0 <= index < len(workers):
        raise ConfigError(f"TF_CONFIG task index {index} is outside its {len(workers)} workers")
    return workers, index


@dataclass(frozen=True)
class World:
    """Who this process is among the workers, and what started them."""
    rank: int = 0
    size: int = 1
    local_rank: int = 0
    local_size: int = 1
    launcher: str = "none"
    cluster: tuple[str, ...] = ()
    tf_config: str | None = None  # the TF_CONFIG distrain writes for MWM under Slurm


def launch(env: Mapping[str, str], step_tasks: int) -> tuple[tuple | None, tuple | None]:
    """Horovod/MPI launch variables, and those that are ambiguous: PMI variables in a multi-task srun step may
    belong to MWM, so auto-detection does not take them for Horovod."""
    found = _launch_vars(env)
    if found and found[0].startswith("PMI") and step_tasks > 1:
        return None, found
    return found, None


def mode(env: Mapping[str, str], gpus: tuple[str, ...], step_tasks: int, launch: tuple | None,
          ambiguous: tuple | None) -> tuple[str, str]:
    """The mode and why: DISTRAIN_MODE, else the first of Horovod's launch, TF_CONFIG, a multi-task Slurm step,
    several GPUs; else single."""
    requested = (env.get("DISTRAIN_MODE") or "auto").strip().lower()
    if requested not in (*MODES, "auto"):
        raise ConfigError(f"unknown DISTRAIN_MODE={requested!r}: use one of auto, {', '.join(MODES)}")
    if requested != "auto":
        return requested, f"DISTRAIN_MODE={requested}"
    if launch:
        return "horovod", f"launched by {launch[0]} ({launch[1]} set)"
    if env.get("TF_CONFIG"):
        return "mwm", "TF_CONFIG is set"
    if step_tasks > 1:
        too = f" ({ambiguous[0]} variables too: set DISTRAIN_MODE=horovod for Horovod)" if ambiguous else ""
        return "mwm", f"Slurm step with {step_tasks} tasks{too}"
    if len(gpus) > 1:
        return "mirrored", f"{len(gpus)} GPUs visible to one process"
    return "single", "one process, " + ("one GPU" if gpus else "no GPU")


def _one_process_world(mode: str, gpus: tuple[str, ...], step_tasks: int, warnings: list[str]) -> World:
    if step_tasks > 1:
        raise ConfigError(
            f"DISTRAIN_MODE={mode} runs one process but this Slurm step has {step_tasks} tasks: "
            "use --ntasks=1, or DISTRAIN_MODE=mwm / horovod"
        )
    if mode == "mirrored" and len(gpus) < 2:
        warnings.append(f"mirrored mode with {len(gpus)} GPU(s): it will train on one device")
    return World(launcher="srun" if step_tasks else "none")


def _mwm_world(env: Mapping[str, str], step_tasks: int, reasons: dict[str, str]) -> World:
    """The MWM cluster: TF_CONFIG as given, else built from the Slurm step (slurm.py)."""
    reasons["rank"] = "task index in the cluster"
    tf_config = env.get("TF_CONFIG")
    if tf_config:
        workers, rank = _parse_tf_config(tf_config)
        host = workers[rank].rsplit(":", 1)[0]
        same_host = [i for i, w in enumerate(workers) if w.rsplit(":", 1)[0] == host]
        reasons["cluster"] = "from TF_CONFIG, used as is"
        return World(rank, len(workers), same_host.index(rank), len(same_host),
                      "distrain launch" if env.get("DISTRAIN_LAUNCHER") else "TF_CONFIG", tuple(workers))
    if step_tasks < 1:
        raise ConfigError("DISTRAIN_MODE=mwm outside any cluster: run under srun with several tasks, use "
                          "`distrain launch -n N`, or set TF_CONFIG")
    step = slurm.read_step(env)
    base = slurm.port_base(step, step.size, env.get("DISTRAIN_PORT_BASE"))
    cluster = tuple(slurm.worker_addresses(step, base))
    source = "DISTRAIN_PORT_BASE" if env.get("DISTRAIN_PORT_BASE") else f"job {step.job_id}.{step.step_id}"
    reasons["cluster"] = f"Slurm {step.distribution} layout of {','.join(step.hosts)}; ports {base}+rank ({source})"
    tf_config = json.dumps({"cluster": {"worker": list(cluster)}, "task": {"type": "worker", "index": step.rank}})
    return World(step.rank, step.size, step.local_id, step.tasks_per_node[step.node_id], "srun", cluster,
                  tf_config)


def _horovod_world(env: Mapping[str, str], step_tasks: int, source: tuple | None,
                   reasons: dict[str, str]) -> World:
    """Horovod's ranks from its launcher's variables (horovodrun, mpirun, srun's PMI)."""
    if not source:
        if step_tasks > 1:
            raise ConfigError("DISTRAIN_MODE=horovod in a Slurm step without MPI/PMI variables: launch with "
                              "srun --mpi=pmix (see `srun --mpi=list`), or mpirun/horovodrun")
        reasons["rank"] = "no MPI/Gloo launcher: one Horovod process"
        return World()
    launcher, _, (rank, size, local_rank, local_size) = source
    if local_size is None and step_tasks:
        step = slurm.read_step(env)
        local_size = step.tasks_per_node[step.node_id]
    reasons["rank"] = f"from {launcher}'s variables; confirmed by hvd.rank() at start"
    return World(rank, size, local_rank, local_size or 1, launcher)


def world(env: Mapping[str, str], mode: str, gpus: tuple[str, ...], step_tasks: int, launch: tuple | None,
           ambiguous: tuple | None, reasons: dict[str, str], warnings: list[str]) -> World:
    if mode in ("single", "mirrored"):
        world = _one_process_world(mode, gpus, step_tasks, warnings)
    elif mode == "mwm":
        world = _mwm_world(env, step_tasks, reasons)
    else:
        world = _horovod_world(env, step_tasks, launch or ambiguous, reasons)
    if not 0 <= world.rank < world.size:
        raise ConfigError(f"rank {world.rank} is outside world size {world.size}: the launcher's variables disagree")
    if not 0 <= world.local_rank < max(world.local_size, 1):
        raise ConfigError(f"local rank {world.local_rank} is outside local size {world.local_size}")
    return world
