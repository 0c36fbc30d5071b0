"""Every DISTRAIN_* variable, in one table (SETTINGS: its documented default, its meaning, numbers' defaults and
bounds, the internal ones marked), and how a value is read from the environment: one rule for every flag and
every duration, each bad value one ConfigError line naming the variable."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from .errors import ConfigError


def flag(env: Mapping[str, str], name: str, default: bool = False) -> bool:
    value = env.get(name, "").strip().lower()
    if value == "":
        return default
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"{name}={env[name]!r}: expected 1 or 0")


def seconds(env: Mapping[str, str], name: str, default: float, minimum: float = 0.0) -> float:
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


@dataclass(frozen=True)
class Setting:
    """One DISTRAIN_* variable: its documented default (docs/reference.md's Configuration says the same, checked
    by tests/unit/test_settings_table.py), and for a number its default and least value, which the Plan reads
    from here. `internal`: set by distrain for its own processes (or the tests' tools), not a user's setting."""

    name: str
    documented: str  # the default as the reference writes it
    meaning: str
    default: float | None = None  # numbers: the value unset
    minimum: float = 0.0
    internal: bool = False


def _s(name: str, documented: str, meaning: str, default: float | None = None, minimum: float = 0.0) -> Setting:
    return Setting(name, documented, meaning, default, minimum)


def _internal(name: str, meaning: str) -> Setting:
    return Setting(name, "", meaning, internal=True)


SETTINGS = (
    _s("DISTRAIN_MODE", "auto", "single, mirrored, mwm, horovod"),
    _s("DISTRAIN_KERAS", "auto", "keras3 or legacy (tf_keras) to force one"),
    _s("DISTRAIN_HOOKS", "1", "0: run the script as is"),
    _s("DISTRAIN_COLLECTIVE", "auto", "ring, nccl (MWM, mirrored)"),
    _s("DISTRAIN_COLLECTIVE_TIMEOUT", "none", "seconds per collective (MWM)"),
    _s("DISTRAIN_START_TIMEOUT", "300", "seconds for all MWM workers to join", 300.0, 1.0),
    _s("DISTRAIN_PORT_BASE", "from job/step id", "first MWM port"),
    _s("DISTRAIN_REQUIRE_GPU", "0 (1 in the image)", "fail when no GPU is visible"),
    _s("DISTRAIN_OUTPUT_DIR", "$SCRATCH/distrain, $WORK/distrain, /tmp/$USER/distrain", "runs' state, checkpoints"),
    _s("DISTRAIN_CHECKPOINT", "1", "0: no checkpoints"),
    _s("DISTRAIN_CHECKPOINT_DIR", "per run", "one run's own directory"),
    _s("DISTRAIN_CHECKPOINT_EVERY", "0 (epochs)", "also every N steps"),
    _s("DISTRAIN_CHECKPOINT_ASYNC", "1", "0: training waits for each checkpoint's write"),
    _s("DISTRAIN_CHECKPOINT_MINUTES", "30", "also checkpoint after this much training time", 30.0),
    _s("DISTRAIN_RUN", "the script + arguments", "name a run"),
    _s("DISTRAIN_RESUME", "1", "0: start the run over"),
    _s("DISTRAIN_MAX_RESTARTS", "3", "restarts from the last checkpoint after a fault", 3.0),
    _s("DISTRAIN_STOP_CHECK_SECONDS", "2", "wall time between the ranks' stop checks", 2.0),
    _s("DISTRAIN_STOP_LEAD", "the job file's STOP_LEAD (120)", "seconds from the stop signal to the kill", 0.0, 1.0),
    _s("DISTRAIN_STALL_SECONDS", "120", "the least time a steady step may take before it is a stall", 120.0, 1.0),
    _s("DISTRAIN_STALL_PAUSE_SECONDS", "1800", "the allowance of first steps and epoch ends", 1800.0, 1.0),
    _s("DISTRAIN_KILL_WAIT", "30", "launch: seconds from a forwarded stop to the kill", 30.0),
    _s("DISTRAIN_CACHE", "$SCRATCH/distrain, …", "distrain image's Apptainer cache, tmp and config"),
    _s("DISTRAIN_VERBOSE", "0", "1: keep TensorFlow's and gRPC's C++ INFO lines"),
    _s("DISTRAIN_REQUIREMENTS", "none", "a pip requirements file: the script's own packages"),
    _s("DISTRAIN_USER_SITE", "0", "1: the image reads ~/.local packages"),
    # the job scripts' (jobs/lib.sh)
    _s("DISTRAIN_IMAGE", "$DISTRAIN_HOME/distrain.sif", "the image"),
    _s("DISTRAIN_VENV", "$DISTRAIN_HOME/.venv", "the virtualenv for USE_CONTAINER=0"),
    _s("DISTRAIN_BIND", "none", "extra bind paths into the image"),
    _s("DISTRAIN_DATA_DIR", "none", "a data directory to bind"),
    _s("DISTRAIN_MODULES", "none", "modules to load first"),
    _s("DISTRAIN_MPI", "pmix if srun has it, else pmi2", "Horovod: srun's MPI plugin"),
    _s("DISTRAIN_HOME", "the job file's checkout", "where jobs/lib.sh is"),
    _s("DISTRAIN_SITE", "$DISTRAIN_HOME/jobs/site.sh", "the site's defaults, sourced first"),
    _internal("DISTRAIN_JOB_FILE", "the job file a job runs (jobs/*.job), for the command that resumes it"),
    _internal("DISTRAIN_LAUNCHER", "set by `distrain launch` for its workers: what started them"),
    _internal("DISTRAIN_PRINT_PLAN", "set by the job scripts: the Plan printed in the job log"),
    _internal("DISTRAIN_RESUME_COMMAND", "set by the job scripts and launch: the command a stop's last line prints"),
    _internal("DISTRAIN_QUEUED_JOBS", "set by bin/distrain: the host's squeue list, for `runs` in the image"),
    _internal("DISTRAIN_SELFTEST_FAULT", "the self-test's negative control (tests only)"),
    _internal("DISTRAIN_VERSION", "the image's build argument: distrain's version in its labels"),
    _internal("DISTRAIN_TEST_TIER", "scripts/test.sh: the tests' tier (full)"),
    _internal("DISTRAIN_TEST_WORKERS", "scripts/test.sh: pytest's workers"),
    _internal("DISTRAIN_TEST_USER", "the ordinary account the tests run as (scripts/install.sh makes it)"),
    _internal("DISTRAIN_REGISTRY", "scripts/container-services.sh: the tests' local registry"),
    _internal("DISTRAIN_CONTAINER_STATE", "scripts/container-services.sh: the tests' dockerd state"),
    _internal("DISTRAIN_APPTAINER_HOME", "scripts/setup-apptainer.sh: where Apptainer is unpacked"),
)
BY_NAME = {setting.name: setting for setting in SETTINGS}


def default(name: str) -> float:
    """The table's default of a numeric setting (the Plan's field defaults are these)."""
    value = BY_NAME[name].default
    assert value is not None, f"{name} has no numeric default in SETTINGS"
    return value


def number(env: Mapping[str, str], name: str) -> float:
    """A numeric setting read by the table's rule: its default unset, at least its minimum (`seconds`)."""
    setting = BY_NAME[name]
    assert setting.default is not None, name
    return seconds(env, name, setting.default, setting.minimum)
