"""Errors a user can act on, and the exit codes distrain uses.

Every failure distrain itself detects is a `DistrainError`: the CLI prints its one-line message (what is wrong
and what to do) and exits with its code, never a traceback. A user script's own exceptions pass through
untouched.
"""

from __future__ import annotations

# Exit codes. 1 is left to the user's script (Python's default for an uncaught exception).
EXIT_USAGE = 2  # bad input: unknown mode, malformed TF_CONFIG, inconsistent Slurm variables, missing script
EXIT_ENVIRONMENT = 3  # the machine cannot run the plan: no GPU, Horovod absent, unwritable directory
EXIT_WORKER_FAILED = 4  # `distrain launch`: a worker died and the others were stopped
EXIT_BUILD_FAILED = 5  # `distrain image build|pull`: apptainer failed; the previous image is untouched
EXIT_PREEMPTED = 75  # stopped on SIGTERM/SIGUSR1 after a checkpoint (EX_TEMPFAIL): safe to requeue


class DistrainError(Exception):
    """A failure with a one-line, actionable message and an exit code."""

    def __init__(self, message: str, exit_code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class RunStopped(BaseException):  # noqa: N818 - a stop, not an error
    """The run stops here to be rerun (a stop signal, or a fresh start this attempt needs): exit 75, requeued. Not
    an Exception, so that a script's own `except Exception:` around its training cannot swallow the stop."""

    exit_code = EXIT_PREEMPTED


class ConfigError(DistrainError):
    """The environment or the command line describes something that cannot run."""

    def __init__(self, message: str) -> None:
        super().__init__(message, EXIT_USAGE)


class EnvironmentProblem(DistrainError):
    """The request is valid but this machine cannot carry it out."""

    def __init__(self, message: str) -> None:
        super().__init__(message, EXIT_ENVIRONMENT)
