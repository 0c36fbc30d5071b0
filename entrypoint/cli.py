"""The `distrain` command (typer): help, plan, doctor, selftest, data, bench, image. Thin: parse, call, print, exit.
Errors distrain detects print one line, `distrain: error: ...`, and exit with a code from `errors`; the user
script's own traceback and exit code pass through unchanged."""

from __future__ import annotations

import json
import os
import platform
from typing import Optional

import typer

from . import __version__, job_files
from .commands import check_script, fail, launch_command, reports_errors, run_script_command
from .errors import EXIT_ENVIRONMENT, ConfigError, DistrainError
from .plan import Plan, as_a_job_sees_it, detect

HELP = """Run an unmodified Keras/TensorFlow train.py on one GPU, all GPUs of a node, or many nodes.

distrain reads the environment (Slurm, MPI/Horovod, TF_CONFIG, DISTRAIN_*) into a Plan, pins GPUs, builds the
distribution strategy and runs your script under it.

\b
  distrain run train.py --epochs 3      run here, in the mode the environment implies
  distrain train.py --epochs 3          the same (what the container image runs)
  distrain launch -n 2 train.py         N local MultiWorkerMirrored workers, no Slurm needed
  distrain plan [--json]                what would run here, and why
  distrain doctor                       plan + versions, GPUs, proxies, caches, problems
  distrain selftest [--json FILE]       prove every mode on this hardware (sbatch jobs/selftest.job: a cluster)

\b
Exit codes: 0 ok · 1 (or the script's own code) the script failed, or a selftest check · 2 bad input/configuration ·
3 this machine cannot run it (no GPU, no Horovod, unwritable dir) · 4 a worker died · 5 image build/pull failed ·
75 stopped on SIGTERM/SIGUSR1/Ctrl-C after a checkpoint (the same command resumes) · 137 killed (start-up
watchdog, or the system) · 130/143 `launch` killed workers that did not stop (a second Ctrl-C, DISTRAIN_KILL_WAIT).
"""

app = typer.Typer(help=HELP, add_completion=False, pretty_exceptions_enable=False, no_args_is_help=True,
                  rich_markup_mode=None)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"distrain {__version__}")
        raise typer.Exit()


@app.callback()
def main_options(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
) -> None:
    """distrain: one train.py, every mode."""


# Everything after the script is the script's: `distrain run train.py --help` is train.py's --help, and
# `distrain run --help` (before any script) is this command's.
PASS_THROUGH = {"allow_extra_args": True, "ignore_unknown_options": True, "allow_interspersed_args": False}


SCRIPT_ARG = typer.Argument(..., help="The training script; its arguments follow.")


@app.command(context_settings=PASS_THROUGH)
def run(ctx: typer.Context, script: str = SCRIPT_ARG) -> None:
    """Run SCRIPT with its arguments, in the mode the environment implies (`distrain plan` shows it).

    Everything after SCRIPT is the script's own (`distrain run train.py --help` is train.py's help). A run is
    the script and its arguments: the same command resumes from its last checkpoint, another starts fresh
    (DISTRAIN_RUN names a run, DISTRAIN_RESUME=0 starts over). SIGTERM/SIGUSR1/Ctrl-C: checkpoint, exit 75.
    Settings: DISTRAIN_* variables (README: Configuration). Exit codes: see `distrain --help`.
    """
    run_script_command(script, list(ctx.args))


@app.command(context_settings=PASS_THROUGH)
def launch(
    ctx: typer.Context,
    script: str = SCRIPT_ARG,
    n: Optional[int] = typer.Option(None, "-n", "--workers", help="Number of local workers (required)."),
    port: Optional[int] = typer.Option(None, "--port", help="First port (default: free ports chosen now)."),
) -> None:
    """Start N local MultiWorkerMirroredStrategy workers for SCRIPT (or `bench`); stop all if one dies.

    Options go before SCRIPT; everything after it is the script's. The first SIGTERM/Ctrl-C reaches every
    worker (checkpoint, exit 75); workers still running DISTRAIN_KILL_WAIT seconds later (30) are killed, and a
    second Ctrl-C kills them at once.
    """
    launch_command(n, script, list(ctx.args), port=port)


def _print_plan(plan: Plan) -> None:
    typer.echo(plan.table())
    for warning in plan.warnings:
        typer.echo(f"warning: {warning}")
    resume = _resume_note(plan)
    if resume:
        typer.echo(resume)


def _resume_note(plan: Plan) -> str | None:
    from .workdirs import problem

    if not plan.checkpoint_workdir:
        return None
    why = problem(plan.checkpoint_workdir)
    if why:
        return f"checkpoint: not used, {why}"
    from .runs import chief_dir, newest_checkpoint, resume_point, stage_dir

    point = resume_point(plan.checkpoint_dir)
    if point is None:
        return None
    stage, position = point
    newest = newest_checkpoint(chief_dir(stage_dir(plan.checkpoint_dir, stage)))
    if not plan.resume:
        return f"resume: no, DISTRAIN_RESUME=0 (the checkpoint {newest} will be removed)"
    at = f" at {position.describe(stage)}" if position else ""
    which = "the next fit()" if stage == 1 else f"the script's fit number {stage}"
    return f"resume: a checkpoint exists ({newest}); {which} resumes from it{at}"


@app.command("plan", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
@reports_errors
def plan_cmd(
    ctx: typer.Context,
    script: Optional[str] = typer.Argument(None, help="The script and its arguments: they name the run."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
    job_name: Optional[str] = typer.Option(None, "--job-name", help="The job's name (e.g. distrain-mwm): on the login "
                                           "node, its mode, nodes and ranks, the run it will be, its directory, "
                                           "where it resumes."),
    nodes: Optional[int] = typer.Option(None, "--nodes", help="With --job-name: sbatch's --nodes, if given."),
    tasks_per_node: Optional[int] = typer.Option(None, "--ntasks-per-node",
                                                 help="With --job-name: sbatch's --ntasks-per-node, if given."),
) -> None:
    """Print what would run here, and why, without importing TensorFlow."""
    if script is not None and script.startswith("-"):  # the script's arguments pass through; distrain's own do not
        raise ConfigError(f"no option {script} of distrain plan (its options: --json, --job-name; then the script)")
    if script is not None:
        check_script(script)  # missing or not Python: exit 2, as `distrain run` says
    env = as_a_job_sees_it(os.environ, job_name, os.getcwd()) if job_name is not None else os.environ
    plan = detect(env, script=script, argv=list(ctx.args))
    job = job_files.for_plan(job_name, os.environ, os.getcwd(), nodes, tasks_per_node) if job_name else None
    if as_json:
        data = {**plan.to_dict(), "resume": _resume_note(plan), **({"job": job[1]} if job else {})}
        typer.echo(json.dumps(data, indent=2, sort_keys=True))
    else:
        if job:
            typer.echo(job[0])
        _print_plan(plan)


@app.command()
def doctor(
    patches: bool = typer.Option(False, "--patches", help="List every patch of another library and its state."),
) -> None:
    """Show the Plan, versions (TensorFlow, Keras, Horovod, CUDA), GPUs, proxies, caches and whether distrain's
    patches of other libraries find what they know; report problems, each on one line."""
    from .tools import doctor as checks

    typer.echo(f"distrain {__version__}, Python {platform.python_version()}, {platform.node()}")
    plan, problems = None, []
    try:
        plan = detect(os.environ)
        _print_plan(plan)
    except DistrainError as exc:
        problems.append(str(exc))
    typer.echo("")
    problems += checks.problems(plan, every_patch=patches)
    if problems:
        for problem in problems:
            typer.echo(f"problem: {problem}", err=True)
        raise typer.Exit(EXIT_ENVIRONMENT)
    typer.echo("no problems found")


@app.command()
def selftest(
    json_out: Optional[str] = typer.Option(None, "--json", help="Also write the rows as JSON to this file."),
    workers: int = typer.Option(2, "--workers", help="Local workers for the MWM and Horovod checks."),
    from_dir: Optional[str] = typer.Option(None, "--from-dir", help="Judge what jobs/selftest.job's srun steps "
                                                                     "wrote to DIR instead of running the checks."),
) -> None:
    """Prove every mode this hardware allows, end to end: short trainings (single, MWM and Horovod with local
    workers; across nodes with `sbatch jobs/selftest.job`), each checked for identical weights on every rank and
    a falling loss, the collective named; with a GPU, mixed precision and XLA against float32, memory growth and
    pinning; then the driver, /dev/shm, InfiniBand, NCCL_* and proxies. A table and a verdict; a check that
    cannot run here is `skip` with its reason. Exit 0 only if nothing failed (1 otherwise).
    """
    from .tools import selftest as selftest_mod

    typer.echo("distrain selftest: " + ("judging the job's checks in " + from_dir if from_dir else
                                        f"single, MWM x{workers}, Horovod x{workers} on this machine (about a minute)"))
    rows = (selftest_mod.judge_allocation(from_dir, os.environ) if from_dir else
            selftest_mod.run_local(workers=workers))
    typer.echo(selftest_mod.report(rows))
    if json_out:
        selftest_mod.write_json(rows, json_out)
        typer.echo(f"distrain: wrote {json_out}")
    raise typer.Exit(1 if selftest_mod.failed(rows) else 0)


@app.command()
@reports_errors
def data(
    out_dir: str = typer.Argument(..., help="Directory for the TFRecord shards."),
    shards: int = typer.Option(8, "--shards", help="Number of files (at least the number of workers)."),
) -> None:
    """Write 1,797 seeded 8x8 digits as TFRecord shards (for examples/tfrecord_digits.py)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from .tools.data import write_digits

    paths = write_digits(out_dir, shards)
    typer.echo(f"wrote {len(paths)} shards to {out_dir}")


@app.command()
@reports_errors
def packages(requirements: str = typer.Argument(..., help="A pip requirements file (DISTRAIN_REQUIREMENTS).")) -> None:
    """Build a script's own packages beforehand (a login node, where compute nodes have no internet): the
    virtualenv runs with DISTRAIN_REQUIREMENTS use, over the image's packages, under the output directory."""
    from . import packages as own

    own.check_base()
    plan = detect({**os.environ, "DISTRAIN_REQUIREMENTS": requirements})
    typer.echo(f"distrain: packages ready: {own.ensure(str(plan.packages_root), str(plan.requirements), typer.echo)}")


@app.command("restart-check", hidden=True, context_settings=PASS_THROUGH)
@reports_errors
def restart_check(
    ctx: typer.Context,
    script: str = SCRIPT_ARG,
    code: int = typer.Option(..., "--code", help="srun's exit code for the step."),
    since: float = typer.Option(..., "--since", help="When the step started (seconds since the epoch)."),
    killed_first: int = typer.Option(-1, "--killed-first", help="The task srun reported killed first (-1: none)."),
) -> None:
    """jobs/lib.sh, after a step failed: restart it (exit 0), end the job (1), or requeue it (10: no worker
    started, a node down?). Prints the one line that says why (restarts.py)."""
    from .restarts import step_verdict

    answer, line = step_verdict(script, list(ctx.args), code, since, killed_first if killed_first >= 0 else None)
    if line:
        typer.echo(line)
    raise typer.Exit(answer)


RESULTS_OPTION = typer.Option(None, "--result", help="Result JSON files for --plot (repeat the option).")


@app.command()
@reports_errors
def bench(
    model: str = typer.Option("small_cnn", help="small_cnn (CPU-sized) or resnet50 (GPU)."),
    batch_per_replica: int = typer.Option(32, "--batch-per-replica", help="Images per replica per step."),
    steps: int = typer.Option(50, help="Timed steps."),
    warmup: int = typer.Option(10, help="Untimed warm-up steps."),
    image_size: Optional[int] = typer.Option(None, "--image-size", help="Default: 32 (small_cnn), 224 (resnet50)."),
    xla: bool = typer.Option(False, "--xla", help="jit_compile the model."),
    mixed_precision: bool = typer.Option(False, "--mixed-precision", help="mixed_float16 policy."),
    baseline: Optional[str] = typer.Option(None, help="Single-replica result JSON, for scaling efficiency."),
    json_out: Optional[str] = typer.Option(None, "--json", help="Write the result (from the chief) as JSON."),
    plot_out: Optional[str] = typer.Option(None, "--plot", help="Plot the given --result files to this PNG."),
    results: Optional[list[str]] = RESULTS_OPTION,
) -> None:
    """Synthetic-data training throughput (images/sec) in the mode the environment implies.

    Works wherever `distrain run` does: plain on one GPU, `distrain launch -n 2 bench`, `TRAIN_SCRIPT=bench
    sbatch jobs/mwm.job`, under horovodrun/mpirun. `--plot out.png --result a.json --result b.json` plots
    throughput against replicas instead of measuring.
    """
    from .tools import bench as bench_mod

    if plot_out:
        if not results:
            fail("--plot needs --result files", 2)
        bench_mod.plot(results, plot_out)
        typer.echo(f"distrain: wrote {plot_out}")
        return
    from . import log, runtime

    plan = detect(os.environ)
    runtime.apply_checks(plan)
    log.configure(plan.line_prefix)
    log.quiet_native_logs(plan.verbose)
    engine = runtime.setup(plan, checked=True)
    base = bench_mod.read_json(baseline) if baseline else None
    config = bench_mod.BenchConfig(model=model, batch_per_replica=batch_per_replica, steps=steps, warmup=warmup,
                                   image_size=image_size, xla=xla, mixed_precision=mixed_precision)
    result = bench_mod.run_bench(engine, config, base)
    if engine.rank == 0:
        typer.echo(bench_mod.table(result))
        if json_out:
            bench_mod.write_json(result, json_out)
            typer.echo(f"distrain: wrote {json_out}")


runs_app = typer.Typer(help="List your runs: where each stopped, and the command that resumes it.",
                       no_args_is_help=False, rich_markup_mode=None)
app.add_typer(runs_app, name="runs")
DIR_OPTION = typer.Option(None, "--dir", help="The output directory (default: DISTRAIN_OUTPUT_DIR, $SCRATCH/distrain, "
                          "$WORK/distrain, /tmp/$USER/distrain; and ./distrain-output, the job scripts' last resort).")


def _output_dirs(directory: str | None) -> list[str]:
    from .plan import listed_output_dirs

    return [directory] if directory else listed_output_dirs(os.environ, os.getcwd())


@runs_app.callback(invoke_without_command=True)
@reports_errors
def runs_list(
    ctx: typer.Context,
    directory: Optional[str] = DIR_OPTION,
    as_json: bool = typer.Option(False, "--json", help="One JSON list, for scripts."),
) -> None:
    """Every run under the output directory: its state, last checkpoint, size, and the command that resumes it.
    `distrain runs show NAME`, `distrain runs rm NAME...`."""
    if ctx.invoked_subcommand:
        return
    from . import runs_view

    listed = [(d, runs_view.find(d)) for d in _output_dirs(directory)]
    if as_json:
        typer.echo(json.dumps([v.as_json() for _, views in listed for v in views], indent=1))
        return
    for where, views in listed:
        typer.echo(f"runs in {where}/runs: {len(views)}")
        for v in views:
            typer.echo(f"  {v.name}  {v.state}")
            typer.echo(f"      {' '.join(v.command)}")
            typer.echo(f"      last checkpoint {runs_view.age(v.last_checkpoint)}, {runs_view.human_size(v.size_bytes)}"
                       f"{f', {v.restarts} restart(s)' if v.restarts else ''}")
            if not v.live and not v.state.startswith("finished") and v.resume:
                typer.echo(f"      resume: {v.resume}")


def _listed(directory: str | None) -> list:
    """Every run in the output directories, listed once (a squeue and a walk of each run's files)."""
    from . import runs_view

    return [v for where in _output_dirs(directory) for v in runs_view.find(where)]


def _one(name: str, directory: str | None, listed: list):  # noqa: ANN202
    from . import runs_view

    found = runs_view.one(listed, name)
    if found:
        return found
    raise DistrainError(f"no run {name!r} in {', '.join(_output_dirs(directory))}: `distrain runs` lists them "
                        "(--dir for another output directory)")


@runs_app.command("show")
@reports_errors
def runs_show(name: str = typer.Argument(..., help="The run's name (or a unique prefix)."),
              directory: Optional[str] = DIR_OPTION,
              as_json: bool = typer.Option(False, "--json", help="JSON, for scripts.")) -> None:
    """One run, whole."""
    from . import runs_view

    found = _one(name, directory, _listed(directory))
    if as_json:
        typer.echo(json.dumps(found.as_json(), indent=1))
        return
    rows = [("name", found.name), ("state", found.state), ("command", " ".join(found.command)),
            ("resume", runs_view.RERUN_OF_FINISHED if found.state.startswith("finished") else found.resume or "-"),
            ("job", found.job or "-"), ("directory", found.directory),
            ("last checkpoint", runs_view.age(found.last_checkpoint)), ("size", runs_view.human_size(found.size_bytes)),
            ("restarts", str(found.restarts)), ("stop needs", runs_view.describe_stop_cost(found.stop_cost))]
    for key, value in rows:
        typer.echo(f"{key:<16}{value}")


RUN_NAMES = typer.Argument(..., help="The runs to delete, with their checkpoints.")


@runs_app.command("rm")
@reports_errors
def runs_rm(names: list[str] = RUN_NAMES,
            directory: Optional[str] = DIR_OPTION,
            yes: bool = typer.Option(False, "-y", "--yes", help="Do not ask.")) -> None:
    """Delete runs and their checkpoints (never a live one)."""
    import shutil

    listed = _listed(directory)
    chosen = [_one(name, directory, listed) for name in names]
    live = [v.name for v in chosen if v.live]
    if live:
        raise DistrainError(f"{', '.join(live)}: running; stop it first (nothing was deleted)")
    for v in chosen:
        if not yes and not typer.confirm(f"delete {v.name} ({v.state}) and its checkpoints in {v.directory}?"):
            continue
        shutil.rmtree(v.directory)
        typer.echo(f"deleted {v.name}")


image_app = typer.Typer(help="Build or pull the Apptainer image (spython), caches kept out of $HOME.",
                        no_args_is_help=True)
app.add_typer(image_app, name="image")


@image_app.command("build")
@reports_errors
def image_build(
    output: str = typer.Argument("distrain.sif", help="The .sif to write (replaced only after a good build)."),
    definition: Optional[str] = typer.Option(None, "--def", help="The definition file (default: the checkout's "
                                             "Apptainer.def, found from any directory)."),
    flavour: str = typer.Option("ngc", "--flavour", help="ngc: on NVIDIA's TensorFlow image (TensorFlow 2.17, the "
                                "default); pypi: TensorFlow 2.21 with PyPI's CUDA on Debian 12 (needs --wheelhouse)."),
    wheelhouse: Optional[str] = typer.Option(None, "--wheelhouse", help="pypi: the wheels to install, filled on "
                                             "this host by scripts/gpu-wheelhouse.sh (default: ./wheelhouse)."),
    base_image: Optional[str] = typer.Option(None, "--base-image", help="BASE_IMAGE build argument (default: the "
                                             "flavour's)."),
    from_docker: Optional[str] = typer.Option(None, "--from-docker", help="Build from a local Docker image instead."),
    expect: Optional[str] = typer.Option(None, "--expect", help="What the base must carry, checked by the build "
                                         "(default: the flavour's: 'tensorflow=2.17 keras=3.3 ... cuda nccl')."),
    fakeroot: bool = typer.Option(True, "--fakeroot/--no-fakeroot", help="apptainer build --fakeroot."),
    allow_home: bool = typer.Option(False, "--allow-home", help="Allow Apptainer's cache under $HOME."),
    notest: bool = typer.Option(False, "--notest", help="Skip the image's own check at the end of the build "
                                "(`%test`: doctor and selftest), e.g. on a login node; run it later on a GPU node: "
                                "apptainer test --nv IMAGE."),
) -> None:
    """Build OUTPUT from Apptainer.def (or --from-docker IMAGE), streaming apptainer's output."""
    from .tools.images import build, flavour_arguments

    arguments = {} if from_docker else flavour_arguments(flavour, base_image, wheelhouse)
    if expect and not from_docker:
        arguments["EXPECT"] = expect
    path = build(definition, output, os.environ, from_docker=from_docker, fakeroot=fakeroot, allow_home=allow_home,
                 build_args=arguments, test=not notest)
    typer.echo(f"distrain: built {path}")


@image_app.command("pull")
@reports_errors
def image_pull(
    uri: str = typer.Argument(..., help="docker://..., oras://..., library://..."),
    output: str = typer.Argument("distrain.sif", help="The .sif to write (replaced only after a good pull)."),
    allow_home: bool = typer.Option(False, "--allow-home", help="Allow Apptainer's cache under $HOME."),
) -> None:
    """Pull URI into OUTPUT, with APPTAINER_CACHEDIR/TMPDIR/CONFIGDIR outside $HOME."""
    from .tools.images import pull

    path = pull(uri, output, os.environ, allow_home=allow_home)
    typer.echo(f"distrain: pulled {path}")
