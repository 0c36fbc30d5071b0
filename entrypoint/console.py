"""The `distrain` console entry, without typer: the two commands that run in every job are parsed here.

`distrain run SCRIPT ...` (every worker) and `distrain launch -n N SCRIPT ...` (the local launcher) have nothing
to parse but a script name and two numbers; typer and click cost about 35 ms of CPU to import and `entrypoint.cli`
69 ms, in every process of every job (#21). Everything else (`--help`, `plan`, `doctor`, ...) goes to `cli`.

What they do is in `commands` (typer-free, shared with `cli`): this module only dispatches.
"""

from __future__ import annotations

import os
import sys
from typing import Optional

from .commands import fail, launch_command, run_script_command

COMMANDS = ("run", "launch", "plan", "doctor", "selftest", "runs", "data", "packages", "bench", "image", "--help", "-h",
            "--version")
HIDDEN_COMMANDS = ("restart-check",)  # jobs/lib.sh's, not a user's


LAUNCH_OPTIONS = {"-n": "workers", "--workers": "workers", "--port": "port"}


def parse_launch(argv: list[str]) -> Optional[tuple[dict[str, int], str, list[str]]]:
    """`[-n N] [--port P] SCRIPT ARGS...` as (options, script, args); None for anything else (typer reports it)."""
    options: dict[str, int] = {}
    index = 0
    while index < len(argv) and argv[index].startswith("-"):
        # --name=value as click reads it; a short option's value is the next argument (click reads -n=3 as "=3")
        name, _, value = argv[index].partition("=") if argv[index].startswith("--") else (argv[index], "", "")
        if name not in LAUNCH_OPTIONS:
            return None
        if not value:
            index += 1
            value = argv[index] if index < len(argv) else ""
        if not value.isdigit():
            return None
        options[LAUNCH_OPTIONS[name]] = int(value)
        index += 1
    if index >= len(argv):
        return None
    return options, argv[index], argv[index + 1:]


def main() -> None:
    """Console entry: `distrain train.py ...` is `distrain run train.py ...` (what the image runs)."""
    argv = sys.argv[1:]
    if argv and argv[0] not in COMMANDS + HIDDEN_COMMANDS and not argv[0].startswith("-"):
        if not os.path.exists(argv[0]) and not argv[0].endswith(".py") and os.sep not in argv[0]:
            commands = ", ".join(c for c in COMMANDS if not c.startswith("-"))
            fail(f"no command or script {argv[0]!r} (commands: {commands}; a script: distrain run train.py)", 2)
        argv = ["run", *argv]
    if len(argv) >= 2 and argv[0] == "run" and not argv[1].startswith("-"):
        try:
            run_script_command(argv[1], argv[2:])
        except KeyboardInterrupt:  # Ctrl-C before the stop handler is installed: as click reports it
            sys.stderr.write("\nAborted!\n")
            sys.exit(1)
        return
    launch = parse_launch(argv[1:]) if argv[:1] == ["launch"] else None
    if launch:
        options, script, args = launch
        launch_command(options.get("workers"), script, args, port=options.get("port"))
    from .cli import app

    app(args=argv, prog_name="distrain")
