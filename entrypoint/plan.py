"""Environment → Plan: every decision distrain makes, as one pure function of the environment.

`detect(env)` imports no TensorFlow and touches nothing: it reads a mapping (and, unless told, the GPU device
files) and returns a frozen `Plan`. Everything after it (`setup`, the engines, the runner) only carries the
Plan out, so `distrain plan` shows exactly what a run will do, and every decision is unit-testable.
"""

from __future__ import annotations

import glob
import json
import os
import re
import socket
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field

from . import runs, slurm, workdirs
from .errors import ConfigError
from .keras_family import FAMILIES, KerasFamily
from .workdirs import WorkDir

MODES = ("single", "mirrored", "mwm", "horovod")
COLLECTIVES = ("auto", "ring", "nccl")
PROXY_VARS = ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY")

# Launch variables of MPI / PMI / horovodrun: (rank, size, local rank, local size), first match wins.
_LAUNCH_VARS = (
    ("horovodrun", ("HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE")),
    ("mpirun (Open MPI)", ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                           "OMPI_COMM_WORLD_LOCAL_SIZE")),
    ("PMIx", ("PMIX_RANK", "SLURM_NTASKS", "SLURM_LOCALID", None)),
    ("PMI", ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS")),
)


@dataclass(frozen=True)
class Plan:
    """What this process will run. Immutable; `distrain plan` prints it, `setup` applies it."""

    mode: str
    rank: int
    size: int
    local_rank: int
    local_size: int
    launcher: str
    gpus_visible: tuple[str, ...]
    devices: tuple[str, ...]
    collective: str
    keras: str
    require_gpu: bool
    hooks: bool = True
    cluster: tuple[str, ...] = ()
    tf_config: str | None = None
    checkpoint_dir: str | None = None
    checkpoint_owned_from: str | None = None  # a default location: checked like ~/.ssh before use (workdirs)
    checkpoint_every: int = 0
    checkpoint_minutes: float = 30.0  # also checkpoint when this long has passed since the last one (0: off)
    checkpoint_dir_named: bool = False  # DISTRAIN_CHECKPOINT_DIR: the user's own directory
    run_name: str | None = None
    run_key: str | None = None  # what a resume must match (runs.identity)
    resume: bool = True
    stop_check_seconds: float = 2.0  # how often (wall time) the ranks agree on a stop or a timed checkpoint
    stall_seconds: float = 120.0  # the floor of a steady step's allowance (10 x the median step, at least this)
    stall_pause_seconds: float = 1800.0  # the allowance of first steps, validation, epoch-end callbacks
    script_uses_horovod_tf: bool = False  # it imports horovod.tensorflow itself (in any mode)
    elastic: bool = False  # Horovod elastic: the script's hvd.elastic.run owns membership, state and recovery
    collective_timeout: float | None = None
    start_timeout: float = 300.0  # seconds for every MWM worker to join before the start-up watchdog ends it
    max_restarts: int = 3  # `distrain launch`: restarts from the last checkpoint after a fault (restarts.py)
    verbose: bool = False  # DISTRAIN_VERBOSE=1: keep TensorFlow's and gRPC's C++ INFO lines
    print_plan: bool = False  # DISTRAIN_PRINT_PLAN=1 (the job scripts): the chief logs this Plan at its start
    resume_command: str | None = None  # DISTRAIN_RESUME_COMMAND: what resumes this run (a job's, a launch's)
    job_id: str | None = None  # SLURM_JOB_ID: the job this run is part of (`distrain runs` shows it)
    node: str = ""  # SLURMD_NODENAME, else the host name: the node as Slurm users know it (stalls, endings)
    env_set: tuple[tuple[str, str], ...] = ()
    env_unset: tuple[str, ...] = ()
    reasons: tuple[tuple[str, str], ...] = field(default=())
    warnings: tuple[str, ...] = ()

    @property
    def family(self) -> KerasFamily:
        """What differs between Keras 3 and tf_keras, for this run's Keras (keras_family.py)."""
        return FAMILIES[self.keras]

    @property
    def is_chief(self) -> bool:
        return self.rank == 0

    @property
    def checkpoint_workdir(self) -> WorkDir | None:
        return WorkDir(self.checkpoint_dir, self.checkpoint_owned_from) if self.checkpoint_dir else None

    @property
    def prefix(self) -> str:
        """The log prefix of this process: [rank/size]."""
        return f"[{self.rank}/{self.size}]"

    @property
    def replicas(self) -> int:
        """The replicas the engine will have, known before TensorFlow loads (Engine.replicas once it is built)."""
        if self.mode == "mwm":
            return self.size * max(1, len(self.devices))
        if self.mode == "mirrored":
            return max(1, len(self.devices))
        return self.size if self.mode == "horovod" else 1

    @property
    def line_prefix(self) -> str:
        """What starts this process's own lines: its prefix, except under `distrain launch`, whose launcher already
        prefixes every line of a worker's output."""
        return "" if self.launcher == "distrain launch" else f"{self.prefix} "

    def to_dict(self) -> dict:
        data = asdict(self)
        data["is_chief"] = self.is_chief
        data["reasons"] = dict(self.reasons)
        data["env_set"] = dict(self.env_set)
        data["env_unset"] = list(self.env_unset)
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    def table(self) -> str:
        """The rows as the aligned table `distrain plan` prints."""
        rows = self.rows()
        width = max(len(r[0]) for r in rows)
        vwidth = min(max(len(r[1]) for r in rows), 48)
        return "\n".join(f"{k:<{width}}  {v:<{vwidth}}  {why}".rstrip() for k, v, why in rows)

    def rows(self) -> list[tuple[str, str, str]]:
        """(field, value, why) rows for the table that `distrain plan` prints."""
        why = dict(self.reasons)
        devices = ",".join(self.devices) if self.devices else "CPU"
        rows = [
            ("mode", self.mode, why.get("mode", "")),
            ("launcher", self.launcher, why.get("launcher", "")),
            ("rank", f"{self.rank} of {self.size}" + (" (chief)" if self.is_chief else ""), why.get("rank", "")),
            ("local rank", f"{self.local_rank} of {self.local_size}", why.get("local_rank", "")),
            ("GPUs visible", ",".join(self.gpus_visible) or "none", why.get("gpus", "")),
            ("devices", devices, why.get("devices", "")),
            ("collective", self.collective, why.get("collective", "")),
            ("keras", self.keras, why.get("keras", "")),
            ("hooks", "on" if self.hooks else "off", why.get("hooks", "")),
        ]
        if self.elastic:
            rows.append(("elastic", "yes", why.get("elastic", "")))
        if self.cluster:
            rows.append(("cluster", " ".join(self.cluster), why.get("cluster", "")))
        if self.run_name:
            rows.append(("run", self.run_name, why.get("run", "")))
        rows.append(("checkpoint", self.checkpoint_dir or "off", why.get("checkpoint", "")))
        if self.env_set:
            names = " ".join(name for name, _ in self.env_set)
            rows.append(("sets", names, why.get("sets", "before TensorFlow loads")))
        if self.env_unset:
            rows.append(("unset", " ".join(self.env_unset), why.get("unset", "")))
        return rows


def probe_gpus(env: Mapping[str, str], dev: str = "/dev") -> tuple[str, ...]:
    """GPU ids this process may use, as CUDA numbers them, without CUDA: CUDA_VISIBLE_DEVICES if set, else one
    per /dev/nvidiaN device file.

    Slurm, `docker --gpus` and `apptainer --nv` all narrow one of these, and neither needs `nvidia-smi`. CUDA
    numbers the GPUs it can open from 0, whatever their N: a container given the host's GPU 3 (`docker run
    --gpus device=3`, NVIDIA_VISIBLE_DEVICES=3) holds /dev/nvidia3 alone and CUDA calls it 0 (nvidia-docker#907),
    so pinning "3" there would hide the GPU and train on the CPU.
    """
    cvd = env.get("CUDA_VISIBLE_DEVICES")
    if cvd is not None:
        ids = [d.strip() for d in cvd.split(",") if d.strip()]
        if not ids or ids[0] in ("-1", "NoDevFiles") or ids[0].startswith("-"):
            return ()
        return tuple(ids)
    return tuple(str(index) for index in range(len(gpu_device_files(dev))))


def gpu_device_files(dev: str = "/dev") -> list[str]:
    """The /dev/nvidiaN files (not nvidiactl, nvidia-uvm, nvidia-caps), by N."""
    names = [os.path.basename(p) for p in glob.glob(os.path.join(dev, "nvidia[0-9]*"))]
    return sorted((os.path.join(dev, n) for n in names if re.fullmatch(r"nvidia\d+", n)),
                  key=lambda path: int(path.rsplit("nvidia", 1)[1]))


def _gpus_reason(env: Mapping[str, str], gpus: tuple[str, ...]) -> str:
    if env.get("CUDA_VISIBLE_DEVICES") is not None:
        return "CUDA_VISIBLE_DEVICES"
    files = gpu_device_files()
    if len(files) != len(gpus) or not files:
        return "/dev/nvidia*"
    shown = ",".join(f.removeprefix("/dev/") for f in files)
    numbered = [f.removeprefix("/dev/nvidia") for f in files] == list(gpus)
    return f"/dev/nvidia*: {shown}" + ("" if numbered else " (CUDA numbers them from 0)")


def _flag(env: Mapping[str, str], name: str, default: bool = False) -> bool:
    value = env.get(name, "").strip().lower()
    if value == "":
        return default
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"{name}={env[name]!r}: expected 1 or 0")


def _int(env: Mapping[str, str], name: str) -> int | None:
    return slurm.int_var(env, name, None)


def _slurm_step_tasks(env: Mapping[str, str]) -> int:
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
        values = [_int(env, n) if n else None for n in names]
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


def _pick_devices(mode: str, gpus: tuple[str, ...], local_rank: int, local_size: int) -> tuple[tuple[str, ...], str]:
    """The GPUs this process drives: a node's visible GPUs are shared evenly among its tasks, a contiguous block
    by local rank (4 GPUs, 2 tasks: local rank 1 gets 2,3; one task: all four, which MWM mirrors over)."""
    if not gpus:
        return (), "no GPU visible: CPU"
    if mode == "mirrored":
        return gpus, f"all {len(gpus)} visible GPUs in one process"
    if mode == "single":
        note = " (restricted so XLA does not spread over the others)" if len(gpus) > 1 else ""
        return gpus[:1], f"one GPU{note}"
    if len(gpus) == 1:
        return gpus, "the one GPU this task was given"
    if len(gpus) % local_size:
        raise ConfigError(
            f"{local_size} tasks on this node share {len(gpus)} visible GPUs, which do not split evenly: ask for one "
            f"GPU per task (--gpus-per-task=1) or make the GPUs per node a multiple of --ntasks-per-node"
        )
    share = len(gpus) // local_size
    if mode == "horovod" and share > 1:
        raise ConfigError(
            f"Horovod drives one GPU per process but {len(gpus)} GPUs are visible to {local_size} task(s) on this "
            "node: run one task per GPU (--ntasks-per-node equal to the GPUs, or --gpus-per-task=1)"
        )
    block = gpus[local_rank * share:(local_rank + 1) * share]
    if share == 1:
        return block, f"GPU by local rank {local_rank} of {len(gpus)} visible"
    return block, f"{share} of the node's {len(gpus)} GPUs, by local rank {local_rank}; MWM mirrors over them"


def _checkpoint_dir(env: Mapping[str, str], run: runs.RunIdentity) -> tuple[WorkDir | None, str]:
    """The run's state directory: the user's DISTRAIN_CHECKPOINT_DIR, else one per run under the output dir."""
    if not _flag(env, "DISTRAIN_CHECKPOINT", default=True):
        return None, "DISTRAIN_CHECKPOINT=0"
    if env.get("DISTRAIN_CHECKPOINT_DIR"):
        return WorkDir(env["DISTRAIN_CHECKPOINT_DIR"]), "DISTRAIN_CHECKPOINT_DIR (resumes only the run it holds)"
    output = workdirs.root(env, "DISTRAIN_OUTPUT_DIR")
    why = "one per run under the output dir (DISTRAIN_OUTPUT_DIR / $SCRATCH / $WORK / /tmp/$USER)"
    if output.is_default:
        why += f"; private, used only if {output.owned_from} is yours"
    return output.below("runs", run.name), why


def _keras_home(env: Mapping[str, str], state_dir: str | None) -> str | None:
    """Keras (3 and tf_keras) writes `~/.keras/keras.json` when it is imported: a user without a `~/.keras` gets
    one from distrain's run unless KERAS_HOME points elsewhere. Then the run's state dir holds it; a user's own
    KERAS_HOME or existing `~/.keras` (their config, their downloaded datasets) is left as it is."""
    home = env.get("HOME")
    if env.get("KERAS_HOME") or not state_dir or not home or os.path.exists(os.path.join(home, ".keras")):
        return None
    return os.path.join(state_dir, "keras")


def _horovod_elastic(env: Mapping[str, str], mode: str) -> tuple[bool, str]:
    """horovodrun in elastic mode (--min-np, --max-np, --host-discovery-script) starts every worker with
    HOROVOD_ELASTIC=1. Workers come and go, ranks are renumbered after each reset, and the script's
    hvd.elastic.run rolls its state back to the last commit: distrain's own recovery (checkpoints, the agreed stop
    of every rank on one rank's signal, the lost-peer exit) would fight that, so it stands aside."""
    if mode != "horovod" or not _flag(env, "HOROVOD_ELASTIC"):
        return False, "not elastic"
    return True, ("HOROVOD_ELASTIC=1 (horovodrun --min-np/--host-discovery-script): the script's hvd.elastic.run "
                  "recovers from a lost worker; a signal or a failure ends only that worker")


def _seconds(env: Mapping[str, str], name: str, default: float, minimum: float = 0.0) -> float:
    raw = (env.get(name) or "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a number") from None
    if value < minimum:
        raise ConfigError(f"{name}={raw!r} must be at least {minimum:g}")
    return value


# the distributions the Keras decision depends on, by normalised name (PEP 503), and the package each one is: a
# pre-release of TensorFlow requires `keras-nightly`, which installs the package `keras` too
_VERSIONED = {"tensorflow": "tensorflow", "tensorflow_cpu": "tensorflow", "tf_nightly": "tensorflow",
              "tf_nightly_cpu": "tensorflow", "keras": "keras", "keras_nightly": "keras", "tf_keras": "tf_keras",
              "tf_keras_nightly": "tf_keras"}
# where a Keras package says its own version, for one installed without the metadata expected
_VERSION_FILES = {"keras": ("keras/src/version.py", "keras/version.py"), "tf_keras": ("tf_keras/__init__.py",)}
_VERSION_LINE = re.compile(r"""^__version__\s*=\s*["']([^"']+)["']""", re.MULTILINE)


def installed_versions(paths: list[str] | None = None) -> dict[str, str]:
    """Versions of the packages the Keras decision depends on, without importing them: from the names of their
    `NAME-VERSION.dist-info` directories on sys.path (the wheel format puts both there), the first on the path
    winning, as for imports. What importlib.metadata reads, without its import (20 ms of CPU in every worker)."""
    found: dict[str, str] = {}
    for entry in sys.path if paths is None else paths:
        try:
            names = sorted(os.listdir(entry or "."))
        except OSError:
            continue
        for name in names:
            stem, dot, kind = name.rpartition(".")
            dist, _, version = stem.partition("-")
            package = _VERSIONED.get(re.sub(r"[-_.]+", "_", dist).lower())
            if dot and kind in ("dist-info", "egg-info") and package and version and package not in found:
                found[package] = version.split("-")[0]
        for package, files in _VERSION_FILES.items():
            version = next(filter(None, (_version_in(entry, f) for f in files)), None) \
                if package not in found and package in names else None
            if version:
                found[package] = version
    return found


def _version_in(entry: str, relative: str) -> str | None:
    try:
        with open(os.path.join(entry or ".", relative)) as handle:
            match = _VERSION_LINE.search(handle.read(4096))
    except OSError:
        return None
    return match.group(1) if match else None


def _major_minor(version: str | None) -> tuple[int, int]:
    match = re.match(r"(\d+)\.(\d+)", version or "")
    return (int(match.group(1)), int(match.group(2))) if match else (0, 0)


# A script asks for tf_keras by importing it, or by setting TF_USE_LEGACY_KERAS itself before importing TensorFlow
# (os.environ["TF_USE_LEGACY_KERAS"] = "1", os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")).
_ASKS_FOR_TF_KERAS = re.compile(
    r"^\s*(import tf_keras|from tf_keras[\s.])|TF_USE_LEGACY_KERAS['\"]\s*(\]\s*=|,)\s*['\"](1|true|True)['\"]",
    re.MULTILINE)
# Horovod's Keras API (horovod.tensorflow.keras, horovod.keras) drives tf_keras only: with Keras 3 its callbacks
# fail and its DistributedOptimizer silently averages nothing (horovod#4290)
_USES_HOROVOD_KERAS = re.compile(
    r"^\s*(import horovod\.(tensorflow\.)?keras|from horovod\.(tensorflow\.)?keras[\s.]"
    r"|from horovod(\.tensorflow)? import keras)", re.MULTILINE)
# Horovod's TensorFlow API with tf.keras models, as Horovod's TF2 examples and docs write it
# (hvd.DistributedGradientTape, hvd.broadcast_variables(model.variables), opt.variables()): Keras 2 idioms, and
# Keras 3 variables have no .ref() for Horovod. A script that imports Keras 3 itself (`import keras`) keeps it.
_USES_HOROVOD_TF_WITH_TF_KERAS = re.compile(r"^\s*(import horovod\.tensorflow(\s|$)|from horovod\.tensorflow import|"
                                            r"from horovod import tensorflow)", re.MULTILINE)
_IMPORTS_KERAS_3 = re.compile(r"^\s*(import keras(\s|$|,)|from keras[\s.])", re.MULTILINE)


def _uses_horovod_tensorflow(script: str | None) -> bool:
    """The script imports Horovod's TensorFlow API itself (then, with Keras 3, compat/keras3_horovod adapts it,
    whatever the mode: a Horovod script also runs as one process)."""
    if not script or not os.path.isfile(script):
        return False
    with open(script, encoding="utf-8", errors="replace") as handle:
        return bool(_USES_HOROVOD_TF_WITH_TF_KERAS.search(handle.read()))


def _keras_family(env: Mapping[str, str], script: str | None, versions: Mapping[str, str]) -> tuple[str, str]:
    """("keras3" | "legacy", why): the Keras that `python train.py` would get here, unless DISTRAIN_KERAS says."""
    requested = (env.get("DISTRAIN_KERAS") or "auto").strip().lower()
    if requested not in ("auto", "legacy", "keras3"):
        raise ConfigError(f"unknown DISTRAIN_KERAS={requested!r}: use auto, legacy (tf_keras) or keras3")
    if requested != "auto":
        return requested, f"DISTRAIN_KERAS={requested}"
    if _flag(env, "TF_USE_LEGACY_KERAS"):
        return "legacy", "TF_USE_LEGACY_KERAS=1 is set: tf.keras is tf_keras"
    if script and os.path.isfile(script):
        with open(script, encoding="utf-8", errors="replace") as handle:
            source = handle.read()
        if _ASKS_FOR_TF_KERAS.search(source):
            return "legacy", "the script imports tf_keras or sets TF_USE_LEGACY_KERAS"
        if _USES_HOROVOD_KERAS.search(source):
            return "legacy", "the script uses Horovod's Keras API, which drives tf_keras only (horovod#4290)"
        if _USES_HOROVOD_TF_WITH_TF_KERAS.search(source) and not _IMPORTS_KERAS_3.search(source):
            return "legacy", ("the script uses Horovod's TensorFlow API with tf.keras, written for Keras 2 "
                              "(opt.variables(), variables with .ref())")
    tf = versions.get("tensorflow")
    if tf and _major_minor(tf) < (2, 16):
        return "legacy", f"TensorFlow {tf} < 2.16: tf.keras is Keras 2"
    if _major_minor(versions.get("keras"))[0] < 3:
        return "legacy", "Keras 3 is not installed"
    return "keras3", f"Keras {versions['keras']}: what `python train.py` gets with TensorFlow {tf or '?'}"


@dataclass(frozen=True)
class _World:
    """Who this process is among the workers, and what started them."""
    rank: int = 0
    size: int = 1
    local_rank: int = 0
    local_size: int = 1
    launcher: str = "none"
    cluster: tuple[str, ...] = ()
    tf_config: str | None = None  # the TF_CONFIG distrain writes for MWM under Slurm


def _launch(env: Mapping[str, str], step_tasks: int) -> tuple[tuple | None, tuple | None]:
    """Horovod/MPI launch variables, and those that are ambiguous: PMI variables in a multi-task srun step may
    belong to MWM, so auto-detection does not take them for Horovod."""
    launch = _launch_vars(env)
    if launch and launch[0].startswith("PMI") and step_tasks > 1:
        return None, launch
    return launch, None


def _mode(env: Mapping[str, str], gpus: tuple[str, ...], step_tasks: int, launch: tuple | None,
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


def _one_process_world(mode: str, gpus: tuple[str, ...], step_tasks: int, warnings: list[str]) -> _World:
    if step_tasks > 1:
        raise ConfigError(
            f"DISTRAIN_MODE={mode} runs one process but this Slurm step has {step_tasks} tasks: "
            "use --ntasks=1, or DISTRAIN_MODE=mwm / horovod"
        )
    if mode == "mirrored" and len(gpus) < 2:
        warnings.append(f"mirrored mode with {len(gpus)} GPU(s): it will train on one device")
    return _World(launcher="srun" if step_tasks else "none")


def _mwm_world(env: Mapping[str, str], step_tasks: int, reasons: dict[str, str]) -> _World:
    """The MWM cluster: TF_CONFIG as given, else built from the Slurm step (slurm.py)."""
    reasons["rank"] = "task index in the cluster"
    tf_config = env.get("TF_CONFIG")
    if tf_config:
        workers, rank = _parse_tf_config(tf_config)
        host = workers[rank].rsplit(":", 1)[0]
        same_host = [i for i, w in enumerate(workers) if w.rsplit(":", 1)[0] == host]
        reasons["cluster"] = "from TF_CONFIG, used as is"
        return _World(rank, len(workers), same_host.index(rank), len(same_host),
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
    return _World(step.rank, step.size, step.local_id, step.tasks_per_node[step.node_id], "srun", cluster,
                  tf_config)


def _horovod_world(env: Mapping[str, str], step_tasks: int, source: tuple | None,
                   reasons: dict[str, str]) -> _World:
    """Horovod's ranks from its launcher's variables (horovodrun, mpirun, srun's PMI)."""
    if not source:
        if step_tasks > 1:
            raise ConfigError("DISTRAIN_MODE=horovod in a Slurm step without MPI/PMI variables: launch with "
                              "srun --mpi=pmix (see `srun --mpi=list`), or mpirun/horovodrun")
        reasons["rank"] = "no MPI/Gloo launcher: one Horovod process"
        return _World()
    launcher, _, (rank, size, local_rank, local_size) = source
    if local_size is None and step_tasks:
        step = slurm.read_step(env)
        local_size = step.tasks_per_node[step.node_id]
    reasons["rank"] = f"from {launcher}'s variables; confirmed by hvd.rank() at start"
    return _World(rank, size, local_rank, local_size or 1, launcher)


def _world(env: Mapping[str, str], mode: str, gpus: tuple[str, ...], step_tasks: int, launch: tuple | None,
           ambiguous: tuple | None, reasons: dict[str, str], warnings: list[str]) -> _World:
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


def _collective(env: Mapping[str, str], mode: str) -> tuple[str, str, float | None]:
    """The all-reduce (MWM, mirrored), why, and the seconds each collective may take."""
    collective = (env.get("DISTRAIN_COLLECTIVE") or "auto").strip().lower()
    if collective not in COLLECTIVES:
        raise ConfigError(f"unknown DISTRAIN_COLLECTIVE={collective!r}: use auto, ring or nccl")
    why = "DISTRAIN_COLLECTIVE" if env.get("DISTRAIN_COLLECTIVE") else "TensorFlow chooses"
    if mode == "horovod":
        why = "Horovod's own (NCCL/MPI/Gloo)"
    timeout_raw = env.get("DISTRAIN_COLLECTIVE_TIMEOUT")
    try:
        timeout = float(timeout_raw) if timeout_raw else None
    except ValueError:
        raise ConfigError(f"DISTRAIN_COLLECTIVE_TIMEOUT={timeout_raw!r} is not a number of seconds") from None
    return collective, why, timeout


def _checkpointing(env: Mapping[str, str], mode: str, run: runs.RunIdentity,
                   reasons: dict[str, str]) -> tuple[WorkDir | None, bool, bool]:
    """The run's state directory (None: no checkpoints), the hooks, Horovod elastic."""
    hooks = _flag(env, "DISTRAIN_HOOKS", default=True)
    checkpoint, reasons["checkpoint"] = _checkpoint_dir(env, run)
    if not hooks:
        checkpoint, reasons["checkpoint"] = None, "off with the hooks (DISTRAIN_HOOKS=0)"
    elastic, reasons["elastic"] = _horovod_elastic(env, mode)
    if elastic:
        checkpoint, reasons["checkpoint"] = None, (
            "off under Horovod elastic: the script's hvd.elastic state rolls a reset back to its last commit, and "
            "a checkpoint restored in the reset would overwrite it; a rerun resumes from what the script saves")
    reasons["hooks"] = "DISTRAIN_HOOKS" if env.get("DISTRAIN_HOOKS") else "default: the script runs unchanged"
    return checkpoint, hooks, elastic


def _environment_effects(env: Mapping[str, str], mode: str, keras: str, devices: tuple[str, ...],
                         gpus: tuple[str, ...], world: _World, keras_home: str | None,
                         reasons: dict[str, str]) -> tuple[dict[str, str], list[str]]:
    """What setup sets and unsets in the environment before TensorFlow loads."""
    env_set: dict[str, str] = {}
    if keras == "legacy":
        env_set["TF_USE_LEGACY_KERAS"] = "1"
    if world.tf_config:
        env_set["TF_CONFIG"] = world.tf_config
    if mode != "horovod" and (devices or gpus):
        env_set["CUDA_VISIBLE_DEVICES"] = ",".join(devices)
    if keras_home:
        env_set["KERAS_HOME"] = keras_home
    env_unset = [v for v in PROXY_VARS if env.get(v)] if mode == "mwm" else []
    if env_unset:
        reasons["unset"] = "gRPC would send MWM's traffic to the proxy and hang"
    return env_set, env_unset


def _timers(env: Mapping[str, str]) -> dict[str, float | int]:
    """The run's timers and counts, each checked (a bad value is one ConfigError line)."""
    every = _int(env, "DISTRAIN_CHECKPOINT_EVERY") or 0
    if every < 0:
        raise ConfigError("DISTRAIN_CHECKPOINT_EVERY must be a number of steps >= 0")
    max_restarts = _int(env, "DISTRAIN_MAX_RESTARTS")
    max_restarts = 3 if max_restarts is None else max_restarts
    if max_restarts < 0:
        raise ConfigError("DISTRAIN_MAX_RESTARTS must be a number of restarts >= 0")
    return {
        "checkpoint_every": every,
        "checkpoint_minutes": _seconds(env, "DISTRAIN_CHECKPOINT_MINUTES", 30.0),
        "stop_check_seconds": _seconds(env, "DISTRAIN_STOP_CHECK_SECONDS", 2.0),  # 0: every step
        "stall_seconds": _seconds(env, "DISTRAIN_STALL_SECONDS", 120.0, minimum=1),
        "stall_pause_seconds": _seconds(env, "DISTRAIN_STALL_PAUSE_SECONDS", 1800.0, minimum=1),
        "start_timeout": _seconds(env, "DISTRAIN_START_TIMEOUT", 300.0, minimum=1),
        "max_restarts": max_restarts,
    }


def _reporting(env: Mapping[str, str]) -> dict[str, bool | str | None]:
    """What the run says about itself: TensorFlow's own INFO lines, the Plan in the log, the command that resumes."""
    return {"verbose": _flag(env, "DISTRAIN_VERBOSE"), "print_plan": _flag(env, "DISTRAIN_PRINT_PLAN"),
            "resume_command": env.get("DISTRAIN_RESUME_COMMAND") or None, "job_id": env.get("SLURM_JOB_ID") or None,
            "node": env.get("SLURMD_NODENAME") or socket.gethostname()}


@dataclass(frozen=True)
class LaunchSettings:
    """What `distrain launch` itself reads (its workers each detect their own Plan)."""

    kill_wait: float  # DISTRAIN_KILL_WAIT: seconds from a forwarded stop to killing the workers still running
    resume_command: str | None  # DISTRAIN_RESUME_COMMAND: a job's, else the launch's own


def launch_settings(env: Mapping[str, str]) -> LaunchSettings:
    return LaunchSettings(_seconds(env, "DISTRAIN_KILL_WAIT", 30.0), env.get("DISTRAIN_RESUME_COMMAND") or None)


@dataclass(frozen=True)
class BatchShell:
    """What `distrain restart-check` reads of its job in the batch shell (jobs/lib.sh), where no step runs."""

    session: str  # "job J.R": the job and its restart count (a requeue is another session)
    tasks: int | None  # SLURM_NTASKS: the workers a step of this job starts


def batch_shell(env: Mapping[str, str]) -> BatchShell:
    return BatchShell(f"job {env.get('SLURM_JOB_ID', '?')}.{env.get('SLURM_RESTART_COUNT', '0')}",
                      _int(env, "SLURM_NTASKS"))


def listed_output_dirs(env: Mapping[str, str], cwd: str) -> list[str]:
    """Where `distrain runs` looks: the output directory a run here would use, and the job scripts' last resort
    ./distrain-output when it holds runs and no DISTRAIN_OUTPUT_DIR is set."""
    found = [workdirs.root(env, "DISTRAIN_OUTPUT_DIR").path]
    local = os.path.join(cwd, "distrain-output")
    if not env.get("DISTRAIN_OUTPUT_DIR") and os.path.isdir(os.path.join(local, "runs")):
        found.append(local)
    return found


def detect(env: Mapping[str, str], gpus: Sequence[str] | None = None, script: str | None = None,
           packages: Mapping[str, str] | None = None, argv: Sequence[str] = ()) -> Plan:
    """Decide mode, ranks, devices and cluster from the environment. Pure: no TensorFlow, no side effects.

    `gpus` overrides the probe of visible GPU ids (tests pass it; None probes CUDA_VISIBLE_DEVICES//dev).
    `packages` overrides the installed versions of tensorflow/keras/tf_keras (None reads package metadata).
    `argv` is the script's arguments: with the script, they say which run this is (runs.identity).
    """
    gpus = tuple(gpus) if gpus is not None else probe_gpus(env)
    reasons: dict[str, str] = {}
    warnings: list[str] = []
    step_tasks = _slurm_step_tasks(env)
    launch, ambiguous = _launch(env, step_tasks)
    mode, reasons["mode"] = _mode(env, gpus, step_tasks, launch, ambiguous)
    world = _world(env, mode, gpus, step_tasks, launch, ambiguous, reasons, warnings)
    devices, reasons["devices"] = _pick_devices(mode, gpus, world.local_rank, world.local_size)
    reasons["gpus"] = _gpus_reason(env, gpus)
    require_gpu = _flag(env, "DISTRAIN_REQUIRE_GPU")
    if require_gpu and not gpus:
        reasons["devices"] = "no GPU visible but DISTRAIN_REQUIRE_GPU=1"
    collective, reasons["collective"], collective_timeout = _collective(env, mode)
    keras, reasons["keras"] = _keras_family(env, script, packages if packages is not None else installed_versions())
    run = runs.identity(env, script, argv)
    reasons["run"] = run.why
    checkpoint, hooks, elastic = _checkpointing(env, mode, run, reasons)
    keras_home = _keras_home(env, checkpoint.path if checkpoint else None)
    env_set, env_unset = _environment_effects(env, mode, keras, devices, gpus, world, keras_home, reasons)
    reasons["launcher"] = reasons.get("launcher", "what started this process")
    reasons["local_rank"] = "ranks on this host; picks the GPU"
    return Plan(
        mode=mode,
        rank=world.rank,
        size=world.size,
        local_rank=world.local_rank,
        local_size=world.local_size,
        launcher=world.launcher,
        gpus_visible=gpus,
        devices=devices,
        collective=collective,
        keras=keras,
        require_gpu=require_gpu,
        hooks=hooks,
        cluster=world.cluster,
        tf_config=world.tf_config,
        checkpoint_dir=checkpoint.path if checkpoint else None,
        checkpoint_owned_from=checkpoint.owned_from if checkpoint else None,
        checkpoint_dir_named=bool(checkpoint and env.get("DISTRAIN_CHECKPOINT_DIR")),
        run_name=run.name if checkpoint else None,
        run_key=run.key if checkpoint else None,
        resume=runs.resume_wanted(env),
        script_uses_horovod_tf=_uses_horovod_tensorflow(script),
        elastic=elastic,
        collective_timeout=collective_timeout,
        env_set=tuple(sorted(env_set.items())),
        env_unset=tuple(env_unset),
        reasons=tuple(sorted(reasons.items())),
        warnings=tuple(warnings),
        **_timers(env),
        **_reporting(env),
    )
