"""Environment → Plan: every decision distrain makes, as one pure function of the environment.

`detect(env)` imports no TensorFlow and touches nothing: it reads a mapping (and, unless told, the GPU device
files) and returns a frozen `Plan`. Everything after it (`setup`, the engines, the runner) only carries the
Plan out, so `distrain plan` shows exactly what a run will do, and every decision is unit-testable.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field

from . import container_paths, keras_family, runs, settings, slurm, workdirs, world
from . import gpus as gpu_files
from .errors import ConfigError
from .keras_family import FAMILIES, KerasFamily
from .settings import flag as _flag
from .workdirs import WorkDir

COLLECTIVES = ("auto", "ring", "nccl")
PROXY_VARS = ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY")
# Horovod's Gloo ends a collective whose peer is this late, horovodrun sets it to its default of 30 s: a rank slowed
# by a loaded node (a directory scan, the first step's tracing) ended the run. distrain's stall watchdog's first
# allowance instead (DISTRAIN_STALL_PAUSE_SECONDS' default); a value of the user's own is kept.
GLOO_TIMEOUT_SECONDS = 1800
HOROVODRUN_GLOO_TIMEOUT = "30"


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
    checkpoint_async: bool = True  # Keras 3: written by a thread from a snapshot (fit/checkpoint_snapshot.py)
    checkpoint_minutes: float = settings.default("DISTRAIN_CHECKPOINT_MINUTES")  # also after this long (0: off)
    checkpoint_dir_named: bool = False  # DISTRAIN_CHECKPOINT_DIR: the user's own directory
    checkpoint_chosen_by: str = ""  # why there (workdirs.chosen_by): the run's first line says it
    run_name: str | None = None
    run_key: str | None = None  # what a resume must match (runs.identity)
    resume: bool = True
    stop_check_seconds: float = settings.default("DISTRAIN_STOP_CHECK_SECONDS")  # how often the ranks agree
    stall_seconds: float = settings.default("DISTRAIN_STALL_SECONDS")  # a steady step's allowance's floor
    stall_pause_seconds: float = settings.default("DISTRAIN_STALL_PAUSE_SECONDS")  # first steps, epoch ends
    stop_lead_seconds: float | None = None  # DISTRAIN_STOP_LEAD: the job's signal lead (fit/stop_cost.py)
    script_uses_horovod_tf: bool = False  # it imports horovod.tensorflow itself (in any mode)
    script_uses_horovod: bool = False  # it imports any of Horovod: it averages itself (compat/horovod_own_updates)
    elastic: bool = False  # Horovod elastic: the script's hvd.elastic.run owns membership, state and recovery
    collective_timeout: float | None = None
    start_timeout: float = settings.default("DISTRAIN_START_TIMEOUT")  # for every MWM worker to join
    max_restarts: int = int(settings.default("DISTRAIN_MAX_RESTARTS"))  # after a fault (restarts.py)
    verbose: bool = False  # DISTRAIN_VERBOSE=1: keep TensorFlow's and gRPC's C++ INFO lines
    print_plan: bool = False  # DISTRAIN_PRINT_PLAN=1 (the job scripts): the chief logs this Plan at its start
    resume_command: str | None = None  # DISTRAIN_RESUME_COMMAND: what resumes this run (a job's, a launch's)
    job_id: str | None = None  # SLURM_JOB_ID: the job this run is part of (`distrain runs` shows it)
    requirements: str | None = None  # DISTRAIN_REQUIREMENTS: the script's own packages (packages.py)
    packages_root: str | None = None  # the output dir, where their virtualenv is built once per digest
    container: str = ""  # apptainer, docker or "": where a missing path may be one not bound (container_paths)
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
        if self.requirements:
            rows.append(("packages", self.requirements, "DISTRAIN_REQUIREMENTS: a virtualenv over the image's, "
                         f"built once under {self.packages_root}/packages"))
        if self.env_set:
            names = " ".join(name for name, _ in self.env_set)
            rows.append(("sets", names, why.get("sets", "before TensorFlow loads")))
        if self.env_unset:
            rows.append(("unset", " ".join(self.env_unset), why.get("unset", "")))
        return rows


def _int(env: Mapping[str, str], name: str) -> int | None:
    return slurm.int_var(env, name, None)


def _checkpoint_dir(env: Mapping[str, str], run: runs.RunIdentity) -> tuple[WorkDir | None, str]:
    """The run's state directory: the user's DISTRAIN_CHECKPOINT_DIR, else one per run under the output dir."""
    if not _flag(env, "DISTRAIN_CHECKPOINT", default=True):
        return None, "DISTRAIN_CHECKPOINT=0"
    if env.get("DISTRAIN_CHECKPOINT_DIR"):
        return WorkDir(env["DISTRAIN_CHECKPOINT_DIR"]), "DISTRAIN_CHECKPOINT_DIR (resumes only the run it holds)"
    output = workdirs.root(env, "DISTRAIN_OUTPUT_DIR")
    why = f"one per run under the output dir, {workdirs.chosen_by(env, 'DISTRAIN_OUTPUT_DIR')}"
    if output.is_default:
        why += f"; private, used only if {output.owned_from} is yours"
    return output.below("runs", run.name), why


def _chosen_by(env: Mapping[str, str]) -> str:
    """Why the run's state is where it is, for its first line."""
    if env.get("DISTRAIN_CHECKPOINT_DIR"):
        return "from DISTRAIN_CHECKPOINT_DIR"
    return workdirs.chosen_by(env, "DISTRAIN_OUTPUT_DIR")


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
                         gpus: tuple[str, ...], this: world.World, keras_home: str | None,
                         reasons: dict[str, str]) -> tuple[dict[str, str], list[str]]:
    """What setup sets and unsets in the environment before TensorFlow loads."""
    env_set: dict[str, str] = {}
    if keras == "legacy":
        env_set["TF_USE_LEGACY_KERAS"] = "1"
    if this.tf_config:
        env_set["TF_CONFIG"] = this.tf_config
    if mode != "horovod" and (devices or gpus):
        env_set["CUDA_VISIBLE_DEVICES"] = ",".join(devices)
    if keras_home:
        env_set["KERAS_HOME"] = keras_home
    gloo_timeout = env.get("HOROVOD_GLOO_TIMEOUT_SECONDS", HOROVODRUN_GLOO_TIMEOUT)
    if mode == "horovod" and gloo_timeout == HOROVODRUN_GLOO_TIMEOUT:
        env_set["HOROVOD_GLOO_TIMEOUT_SECONDS"] = str(GLOO_TIMEOUT_SECONDS)
        reasons["gloo"] = (f"timeout {GLOO_TIMEOUT_SECONDS} s: at Gloo's 30 s a rank waiting for a slow one ended the "
                           "run ('Horovod has been shut down'); a stuck rank is the stall watchdog's to name")
    env_unset = [v for v in PROXY_VARS if env.get(v)] if mode == "mwm" else []
    if env_unset:
        reasons["unset"] = "gRPC would send MWM's traffic to the proxy and hang"
    return env_set, env_unset


def _timers(env: Mapping[str, str]) -> dict[str, float | int | None]:
    """The run's timers and counts, and how checkpoints are written, each checked (a bad value is one ConfigError
    line)."""
    every = _int(env, "DISTRAIN_CHECKPOINT_EVERY") or 0
    if every < 0:
        raise ConfigError("DISTRAIN_CHECKPOINT_EVERY must be a number of steps >= 0")
    max_restarts = _int(env, "DISTRAIN_MAX_RESTARTS")
    max_restarts = int(settings.default("DISTRAIN_MAX_RESTARTS")) if max_restarts is None else max_restarts
    if max_restarts < 0:
        raise ConfigError("DISTRAIN_MAX_RESTARTS must be a number of restarts >= 0")
    return {
        "checkpoint_every": every,
        "checkpoint_async": _flag(env, "DISTRAIN_CHECKPOINT_ASYNC", default=True),
        "checkpoint_minutes": settings.number(env, "DISTRAIN_CHECKPOINT_MINUTES"),
        "stop_check_seconds": settings.number(env, "DISTRAIN_STOP_CHECK_SECONDS"),  # 0: every step
        "stall_seconds": settings.number(env, "DISTRAIN_STALL_SECONDS"),
        "stall_pause_seconds": settings.number(env, "DISTRAIN_STALL_PAUSE_SECONDS"),
        "start_timeout": settings.number(env, "DISTRAIN_START_TIMEOUT"),
        "max_restarts": max_restarts,
        "stop_lead_seconds": settings.number(env, "DISTRAIN_STOP_LEAD") or None,  # unset: the job file's lead
    }


def _reporting(env: Mapping[str, str]) -> dict[str, bool | str | None]:
    """What the run says about itself: TensorFlow's own INFO lines, the Plan in the log, the command that resumes."""
    return {"verbose": _flag(env, "DISTRAIN_VERBOSE"), "print_plan": _flag(env, "DISTRAIN_PRINT_PLAN"),
            "resume_command": env.get("DISTRAIN_RESUME_COMMAND") or None, "job_id": env.get("SLURM_JOB_ID") or None,
            "node": env.get("SLURMD_NODENAME") or socket.gethostname(), "container": container_paths.container(env),
            **_requirements(env)}


def _requirements(env: Mapping[str, str]) -> dict[str, str | None]:
    """DISTRAIN_REQUIREMENTS, a file that must exist, and the output dir its virtualenv goes under."""
    named = env.get("DISTRAIN_REQUIREMENTS")
    if not named:
        return {}
    if not os.path.isfile(named):
        raise ConfigError(f"DISTRAIN_REQUIREMENTS={named}: no such file (a pip requirements file)")
    return {"requirements": os.path.abspath(named), "packages_root": workdirs.root(env, "DISTRAIN_OUTPUT_DIR").path}


@dataclass(frozen=True)
class LaunchSettings:
    """What `distrain launch` itself reads (its workers each detect their own Plan)."""

    kill_wait: float  # DISTRAIN_KILL_WAIT: seconds from a forwarded stop to killing the workers still running
    resume_command: str | None  # DISTRAIN_RESUME_COMMAND: a job's, else the launch's own


def launch_settings(env: Mapping[str, str]) -> LaunchSettings:
    return LaunchSettings(settings.number(env, "DISTRAIN_KILL_WAIT"), env.get("DISTRAIN_RESUME_COMMAND") or None)


@dataclass(frozen=True)
class BatchShell:
    """What `distrain restart-check` reads of its job in the batch shell (jobs/lib.sh), where no step runs."""

    session: str  # "job J.R": the job and its restart count (a requeue is another session)
    tasks: int | None  # SLURM_NTASKS: the workers a step of this job starts


def batch_shell(env: Mapping[str, str]) -> BatchShell:
    return BatchShell(f"job {env.get('SLURM_JOB_ID', '?')}.{env.get('SLURM_RESTART_COUNT', '0')}",
                      _int(env, "SLURM_NTASKS"))


JOB_OUTPUT_DIR = "distrain-output"  # jobs/lib.sh's last resort, in the submit directory: every node sees it


def as_a_job_sees_it(env: Mapping[str, str], job_name: str, cwd: str) -> dict[str, str]:
    """The environment a job submitted from `cwd` as `job_name` gives distrain (jobs/lib.sh): its name names the
    run, and without DISTRAIN_OUTPUT_DIR, $SCRATCH or $WORK its outputs go to `cwd`/distrain-output, not /tmp."""
    seen = {**env, "SLURM_JOB_NAME": job_name}
    if not any(env.get(name) for name in ("DISTRAIN_OUTPUT_DIR", "SCRATCH", "WORK")):
        seen["DISTRAIN_OUTPUT_DIR"] = os.path.join(cwd, JOB_OUTPUT_DIR)
    return seen


def listed_output_dirs(env: Mapping[str, str], cwd: str) -> list[str]:
    """Where `distrain runs` looks: the output directory a run here would use, and the job scripts' last resort
    ./distrain-output when it holds runs and no DISTRAIN_OUTPUT_DIR is set."""
    found = [workdirs.root(env, "DISTRAIN_OUTPUT_DIR").path]
    local = os.path.join(cwd, JOB_OUTPUT_DIR)
    if not env.get("DISTRAIN_OUTPUT_DIR") and os.path.isdir(os.path.join(local, "runs")):
        found.append(local)
    return found


def _read(script: str | None) -> str:
    if not script or not os.path.isfile(script):
        return ""
    with open(script, encoding="utf-8", errors="replace") as handle:
        return handle.read()


def detect(env: Mapping[str, str], gpus: Sequence[str] | None = None, script: str | None = None,
           packages: Mapping[str, str] | None = None, argv: Sequence[str] = ()) -> Plan:
    """Decide mode, ranks, devices and cluster from the environment. Pure: no TensorFlow, no side effects.

    `gpus`, `packages`: the visible GPU ids and tensorflow's, keras' and tf_keras' versions (tests); `argv`: the
    script's arguments, which with the script say which run this is."""
    gpus = tuple(gpus) if gpus is not None else gpu_files.probe_gpus(env)
    reasons: dict[str, str] = {}
    warnings: list[str] = []
    step_tasks = world.slurm_step_tasks(env)
    launch, ambiguous = world.launch(env, step_tasks)
    mode, reasons["mode"] = world.mode(env, gpus, step_tasks, launch, ambiguous)
    this = world.world(env, mode, gpus, step_tasks, launch, ambiguous, reasons, warnings)
    devices, reasons["devices"] = gpu_files.pick_devices(mode, gpus, this.local_rank, this.local_size)
    reasons["gpus"] = gpu_files.gpus_reason(env, gpus)
    require_gpu = _flag(env, "DISTRAIN_REQUIRE_GPU")
    if require_gpu and not gpus:
        reasons["devices"] = "no GPU visible but DISTRAIN_REQUIRE_GPU=1"
    collective, reasons["collective"], collective_timeout = _collective(env, mode)
    versions = keras_family.installed_versions() if packages is None else packages
    keras, reasons["keras"] = keras_family.choose(env, source := _read(script), versions)  # the script read once
    run = runs.identity(env, script, argv)
    reasons["run"] = run.why
    checkpoint, hooks, elastic = _checkpointing(env, mode, run, reasons)
    keras_home = _keras_home(env, checkpoint.path if checkpoint else None)
    env_set, env_unset = _environment_effects(env, mode, keras, devices, gpus, this, keras_home, reasons)
    reasons["launcher"] = reasons.get("launcher", "what started this process")
    reasons["local_rank"] = "ranks on this host; picks the GPU"
    return Plan(
        mode=mode,
        rank=this.rank,
        size=this.size,
        local_rank=this.local_rank,
        local_size=this.local_size,
        launcher=this.launcher,
        gpus_visible=gpus,
        devices=devices,
        collective=collective,
        keras=keras,
        require_gpu=require_gpu,
        hooks=hooks,
        cluster=this.cluster,
        tf_config=this.tf_config,
        checkpoint_dir=checkpoint.path if checkpoint else None,
        checkpoint_owned_from=checkpoint.owned_from if checkpoint else None,
        checkpoint_dir_named=bool(checkpoint and env.get("DISTRAIN_CHECKPOINT_DIR")),
        checkpoint_chosen_by=_chosen_by(env) if checkpoint else "",
        run_name=run.name if checkpoint else None,
        run_key=run.key if checkpoint else None,
        resume=runs.resume_wanted(env),
        **keras_family.horovod_use(source),
        elastic=elastic,
        collective_timeout=collective_timeout,
        env_set=tuple(sorted(env_set.items())),
        env_unset=tuple(env_unset),
        reasons=tuple(sorted(reasons.items())),
        warnings=tuple(warnings),
        **_timers(env),
        **_reporting(env),
    )
