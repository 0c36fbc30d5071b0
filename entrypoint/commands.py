"""What the commands every job runs do, without typer: `run` (every worker), `launch` (the local launcher), and the
one-line error report every command shares. The console entry (console.py) and the typer CLI (cli.py) both call
them; neither is imported here, so the two never import each other.

Errors distrain detects print one line, `distrain: error: ...`, and exit with a code from `errors`; the user
script's own traceback and exit code pass through unchanged.
"""

from __future__ import annotations

import functools
import os
import platform
import sys
import traceback
from typing import Any, Callable, NoReturn, Optional, TypeVar

from .errors import (
    EXIT_ENVIRONMENT,
    EXIT_PREEMPTED,
    EXIT_USAGE,
    EXIT_WORKER_FAILED,
    ConfigError,
    DistrainError,
    RunStopped,
)

Func = TypeVar("Func", bound=Callable)
LAUNCH_NEEDS_N = "distrain launch needs -n N, the number of local workers to start: distrain launch -n 2 train.py"


def fail(message: str, code: int) -> NoReturn:
    from .log import line_start  # on a line of its own, after a progress bar left mid-line

    sys.stderr.write(f"{line_start()}distrain: error: {message}\n")
    raise SystemExit(code)


def reports_errors(func: Func) -> Func:
    """Turn DistrainError into one line on stderr and its exit code."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):  # noqa: ANN202
        try:
            return func(*args, **kwargs)
        except (DistrainError, RunStopped) as exc:
            if exc.exit_code == EXIT_PREEMPTED:  # a clean, checkpointed stop is not an error
                from .log import line_start

                sys.stderr.write(f"{line_start()}distrain: {exc}\n")
                sys.stdout.flush()
                sys.stderr.flush()
                # everything is saved; the interpreter's teardown can hang in MWM's collectives (seen on TF 2.21:
                # both workers stopped, then neither exited), so leave now, and leave no data worker behind
                from . import descendants, log

                descendants.kill_all(log.filter_processes())
                os._exit(EXIT_PREEMPTED)
            fail(str(exc), exc.exit_code)

    return wrapper  # type: ignore[return-value]


def check_script(script: str) -> str:
    """Refuse a missing or non-Python script before anything slow happens."""
    if not os.path.isfile(script):
        raise ConfigError(
            f"training script {script!r} not found (relative to {os.getcwd()}): check the path and bind mounts"
        )
    if not script.endswith(".py"):
        with open(script, "rb") as handle:
            head = handle.read(200)
        if not head.startswith(b"#!") or b"python" not in head.split(b"\n", 1)[0]:
            raise ConfigError(f"{script!r} is not a Python script (expected a .py file)")
    with open(script, "rb") as handle:
        source = handle.read()
    try:  # before TensorFlow loads and before a run is started: one line, not a traceback through distrain
        compile(source, script, "exec", dont_inherit=True)
    except (SyntaxError, ValueError) as exc:
        where = f"{script}:{exc.lineno}" if getattr(exc, "lineno", None) else script
        why = getattr(exc, "msg", exc)
        raise ConfigError(f"{where}: {why}: the script does not compile; fix it and rerun") from None
    return os.path.abspath(script)


@reports_errors
def run_script_command(script: str, args: list[str]) -> None:
    """`distrain run SCRIPT ARGS...`: what every worker of every job runs."""
    from . import startup_stop

    startup_stop.install()  # first: a stop while TensorFlow loads or the workers meet is exit 75, not 143
    from . import log, runtime
    from .plan import detect

    if script == "selftest-worker":  # what jobs/selftest.job starts per mode (selftest_train.py, in the package)
        from .tools.selftest import WORKER as script
    path = check_script(script)
    plan = detect(os.environ, script=path, argv=args)
    runtime.apply_checks(plan)
    logger = log.configure(plan.line_prefix)
    if plan.requirements and plan.packages_root:  # before TensorFlow loads: the script's packages first
        from . import packages

        packages.use(packages.ensure(plan.packages_root, plan.requirements, logger.info))
    if plan.checkpoint_workdir:
        _open_the_runs_state(plan, path, args, logger)
    _say_what_runs(plan, logger)
    log.quiet_native_logs(plan.verbose)
    _run_and_record_the_end(plan, path, args)


def _open_the_runs_state(plan: Any, path: str, args: list[str], logger: Any) -> None:
    """The run's state dir made private and writable, locked by this rank; the chief says new or resuming."""
    from . import runs
    from .fit.saves import check_writable
    from .workdirs import prepare

    what = "the checkpoint directory (DISTRAIN_CHECKPOINT_DIR)"
    prepare(plan.checkpoint_workdir, what, warn=logger.warning)
    check_writable(plan.checkpoint_dir, what)
    identity = runs.RunIdentity(plan.run_name, plan.run_key, "")
    first = runs.open_run(plan.checkpoint_dir, identity, plan.rank, [path, *args], plan.resume,
                          plan.checkpoint_dir_named, _about_the_run(plan, path, args), plan.checkpoint_chosen_by)
    if plan.is_chief:
        logger.info(first)
        if first.startswith("new run ") and (alike := runs.unfinished_alike(plan.checkpoint_dir, identity, path)):
            logger.info(alike)


def _say_what_runs(plan: Any, logger: Any) -> None:
    """The chief: the mode and why (and the Plan in a job log); every rank: who it is and its devices."""
    if plan.is_chief:
        logger.info(f"{plan.mode} on {plan.size} worker(s); {dict(plan.reasons)['mode']}")
        if plan.mode == "horovod" and plan.size > 1 and not plan.elastic and plan.checkpoint_dir and \
                plan.launcher in ("horovodrun", "mpirun (Open MPI)"):
            logger.info("a lost worker ends this run (exit 4; the same command resumes it): restarts without a "
                        "person need `distrain launch` (MWM) or Horovod elastic (horovodrun --min-np)")
        if plan.print_plan:
            for line in plan.table().splitlines():
                logger.info(f"plan | {line}")
    devices = f"GPU {','.join(plan.devices)}" if plan.devices else "CPU"
    logger.info(f"rank {plan.rank} of {plan.size} on {platform.node()}: local rank {plan.local_rank}, {devices}")


def _run_and_record_the_end(plan: Any, path: str, args: list[str]) -> None:
    """Set up, run the script, and record how this worker ended (endings.py): a lost peer is one line and exit 4,
    the script's own error its traceback and exit 1."""
    from . import runner, runtime, startup_stop
    from .fit import batches
    from .fit.stopping import ignore_stop_signals

    ending = _Ending(plan.checkpoint_dir, plan.rank, plan.size, plan.node)
    startup_stop.when_stopped(lambda why: ending.record(EXIT_PREEMPTED, why))
    engine = None
    evened = batches.EvenedInputs()  # exact resume's datasets, evened already (fit/batches.py)
    try:
        engine = runtime.setup(plan, checked=True,
                               before_distributing=batches.before_distributing(evened) if plan.hooks else None)
        runner.run_script(path, args, engine, evened)
    except SystemExit as exc:
        ending.record(exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1, "the script exited")
        raise
    except (DistrainError, RunStopped) as exc:
        ending.record(exc.exit_code, str(exc))
        raise
    except BaseException as exc:  # the script's own error: its traceback, once, then Python's usual exit code 1
        from .peers import lost_peer

        ignore_stop_signals()  # the run has failed: a TERM now (horovodrun, srun ending the job) must not cut
        peers = engine.peers if engine else ()  # this report short or claim a stop it cannot checkpoint
        lost = lost_peer(exc, plan, peers)
        if lost:  # not the script's fault: another worker died under it. Exit now: the collectives are broken, and
            ending.record(EXIT_WORKER_FAILED, lost)  # interpreter teardown can hang in them
            sys.stderr.write(f"{plan.line_prefix}distrain: error: {lost}\n")  # which survivor, in a job log
            sys.stdout.flush()
            sys.stderr.flush()
            from .fit.checkpoint_snapshot import finish_writes

            finish_writes()  # the checkpoint being written ends whole first
            os._exit(EXIT_WORKER_FAILED)
        from .container_paths import outside
        from .endings import one_line
        from .one_process_loops import outside_the_strategy
        from .user_site import unread_module

        unbound = outside(exc, plan.container) or unread_module(exc, os.environ)
        if unbound:  # not the script's fault either: its data is not bound, its package not read, in the image
            ending.record(EXIT_USAGE, unbound)
            sys.stderr.write(f"{plan.line_prefix}distrain: error: {unbound}\n")
            raise SystemExit(EXIT_USAGE) from None
        one_process = outside_the_strategy(exc, plan.mode, plan.replicas)
        if one_process:  # plain python runs it: a loop distrain's replicas cannot take, said in one line
            ending.record(EXIT_ENVIRONMENT, one_process)
            sys.stderr.write(f"{plan.line_prefix}distrain: error: {one_process}\n")
            raise SystemExit(EXIT_ENVIRONMENT) from None
        ending.record(1, one_line(exc))
        traceback.print_exc()
        sys.stderr.flush()
        raise SystemExit(1) from None
    ignore_stop_signals()  # the script is done: a TERM during TensorFlow's teardown must not turn exit 0 into 143
    ending.record(0)


def _about_the_run(plan: Any, path: str, args: list[str]) -> dict[str, str]:
    """What `distrain runs` shows of a run: the command that resumes it (a job script's, with its sbatch options;
    a launch's; else this one), where it was started, its Slurm job."""
    import shlex

    resume = plan.resume_command or shlex.join(["distrain", "run", path, *args])
    about = {"resume": resume, "cwd": os.getcwd(), "started": platform.node()}
    if plan.job_id:
        about["job"] = plan.job_id
    return about


class _Ending:
    """This worker's record in the run's state (endings.py): written at its start, completed at its end."""

    def __init__(self, state_dir: str | None, rank: int, size: int, node: str) -> None:
        from . import endings

        self.state_dir, self.rank = state_dir, rank
        if state_dir:
            endings.started(state_dir, rank, size, node)

    def record(self, code: int, why: str = "") -> None:
        from . import endings

        if self.state_dir:
            endings.ended(self.state_dir, self.rank, code, why)


@reports_errors
def launch_command(workers: int | None, script: str, args: list[str], port: Optional[int] = None) -> NoReturn:
    """`distrain launch -n N SCRIPT ARGS...`: N local MWM workers (see `launcher`); -n is required."""
    from . import launcher

    if workers is None:
        fail(LAUNCH_NEEDS_N, 2)
    if script != "bench":
        check_script(script)
    raise SystemExit(launcher.launch(workers, script, args, port=port))
