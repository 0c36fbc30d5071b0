"""The training work every benchmark measures: a small CNN on fixed synthetic data.

`--handmade none` is an ordinary Keras script with a global batch (what `distrain run` distributes, splitting the
batches between the ranks itself). `--handmade single|mwm|horovod` is the same work written by hand for that mode,
the way the user guides do it (Horovod: each rank its shard of the data, per-rank batches): the baseline.

Two measures, one line from the chief:
- default: `BENCH {"images_per_sec", "first_step"}`, throughput over --steps steps after --warmup;
- `--epochs N`: `BENCH {"epoch_s"}`, the median time of epochs 2..N of `fit` on --samples numpy samples (what a
  user waits for; the first epoch traces the graph).
`--pin` pins every thread of the process to one core (by local rank), so two workers on a small machine do not
fight over its cores (threads made later inherit the mask; the runner sets TF_NUM_INTRAOP_THREADS).
The default line also carries the start-up phases: the process's start, and under distrain the wall time its
set-up phases ended (plan, tensorflow, strategy: entrypoint.runtime.startup_phases), for benchmarks/run.py startup.
"""

import argparse
import json
import os
import statistics
import sys
import time

SCRIPT_START = time.time()


def cpu_now() -> float:
    """CPU seconds of this process so far (every thread, user + system), to the nanosecond. Not os.times(): it
    counts in clock ticks (10 ms), coarse enough for a smoke run's few steady steps to read 0 s (a suspect for the
    ZeroDivisionError in run.py's ratios, CI of 2026-11-27)."""
    return time.process_time()


SCRIPT_START_CPU = cpu_now()


def stat_fields(path: str) -> list[str]:
    """The fields of a /proc .../stat file after the command name (whose parentheses may hold spaces): index 0 is
    the state, field 3 of proc(5)."""
    with open(path) as stat:
        return stat.read().rsplit(")", 1)[1].split()


def process_start() -> float:
    """This process's start, wall time: its age from the kernel (/proc/self/stat field 22, clock ticks after
    boot, against /proc/uptime) taken from now. Not /proc/stat's btime, which is whole seconds: up to 1 s off."""
    ticks = int(stat_fields("/proc/self/stat")[19])
    with open("/proc/uptime") as uptime:
        age = float(uptime.read().split()[0]) - ticks / os.sysconf("SC_CLK_TCK")
    return time.time() - age


def cpu_by_thread() -> dict[str, float]:
    """This process's CPU seconds (user + system, from the kernel) per thread name, digits dropped so a pool's
    threads add up, the main thread apart ("main thread"), with the process total under "*"."""
    ticks = os.sysconf("SC_CLK_TCK")
    totals: dict[str, float] = {}
    for task in os.listdir("/proc/self/task"):
        try:
            fields = stat_fields(f"/proc/self/task/{task}/stat")
            with open(f"/proc/self/task/{task}/comm") as comm:
                name = "".join(c for c in comm.read().strip() if not c.isdigit()) or "?"
        except OSError:
            continue  # it ended meanwhile
        name = "main thread" if task == str(os.getpid()) else name
        totals[name] = totals.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / ticks
    return {"*": cpu_now(), **dict(sorted(totals.items(), key=lambda item: -item[1]))}


def distrain_phases() -> dict:
    runtime = sys.modules.get("entrypoint.runtime")
    return {f"phase_{name}": at for name, at in runtime.startup_phases().items()} if runtime else {}


parser = argparse.ArgumentParser()
parser.add_argument("--handmade", choices=["none", "single", "mwm", "horovod"], default="none")
parser.add_argument("--keras", choices=["keras3", "legacy"], default="legacy",
                    help="the family the hand-written versions use (distrain's comes from DISTRAIN_KERAS)")
parser.add_argument("--steps", type=int, default=60)
parser.add_argument("--warmup", type=int, default=10)
parser.add_argument("--batch", type=int, default=64, help="global batch")
parser.add_argument("--epochs", type=int, default=0, help="measure epoch time over this many epochs")
parser.add_argument("--samples", type=int, default=4096, help="samples per epoch with --epochs")
parser.add_argument("--pin", action="store_true")
parser.add_argument("--cpu-by-thread", action="store_true",
                    help="every rank prints `THREADS {...}`: its CPU seconds by thread name, to find where CPU goes")
parser.add_argument("--time-hooks", action="store_true",
                    help="every rank prints `HOOKS {...}`: the CPU time of each hook of the callbacks distrain added "
                         "to fit, timed in place (in the real fit, between real steps)")
parser.add_argument("--gc-stats", action="store_true",
                    help="every rank prints `GC {...}`: Python's garbage collections by generation and their CPU "
                         "time since the script started, the same at the first step (`*_before`: fit's share is the "
                         "difference), and the objects the collector tracks")
parser.add_argument("--upstream-fixes", action="store_true",
                    help="hand-written Keras 3 MWM: apply by hand the upstream fixes distrain applies (keras3_mwm)")
parser.add_argument("--default-strategy", action="store_true",
                    help="hand-written MWM: also make its strategy the process's default, as distrain does "
                         "(tf.distribute.experimental_set_strategy), to measure what that alone costs")
args = parser.parse_args()

gc_stats: dict = {"collections": [0, 0, 0], "cpu_s": [0.0, 0.0, 0.0]}


def _time_collections(phase: str, info: dict) -> None:
    if phase == "start":
        gc_stats["began"] = time.thread_time()
    elif "began" in gc_stats:
        generation = info["generation"]
        gc_stats["collections"][generation] += 1
        gc_stats["cpu_s"][generation] += time.thread_time() - gc_stats.pop("began")


if args.gc_stats:
    import gc

    gc.callbacks.append(_time_collections)


def local_rank() -> int:
    for name in ("HOROVOD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "DISTRAIN_LOCAL_RANK"):
        if name in os.environ:
            return int(os.environ[name])
    if "TF_CONFIG" in os.environ:
        return json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    return 0


if args.handmade != "none":
    os.environ["TF_USE_LEGACY_KERAS"] = "1" if args.keras == "legacy" else "0"
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np  # noqa: E402
import small_cnn  # noqa: E402 - benchmarks/, this script's directory
import tensorflow as tf  # noqa: E402

if args.pin:  # after the import, as under distrain
    small_cnn.pin_to_one_core(local_rank())
hvd = None
strategy = tf.distribute.get_strategy()
rank, size = 0, 1
if args.handmade == "mwm":
    if args.upstream_fixes:  # Keras 3's MWM fit fails without them (tensorflow#72388, keras-team/keras#20585)
        from entrypoint.compat import keras3_mwm

        keras3_mwm.apply(tf)
    for name in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY"):
        os.environ.pop(name, None)
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    if args.default_strategy:
        tf.distribute.experimental_set_strategy(strategy)
    rank = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
elif args.handmade == "horovod":
    import horovod.tensorflow.keras as hvd

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
elif args.handmade == "none" and "TF_CONFIG" in os.environ:
    rank = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
elif args.handmade == "none":
    rank = int(os.environ.get("HOROVOD_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0")))

with strategy.scope():
    model = small_cnn.build(tf.keras, *([hvd.DistributedOptimizer] if hvd is not None else []))

HOOKS = ("on_train_begin", "on_epoch_begin", "on_train_batch_begin", "on_train_batch_end", "on_epoch_end",
         "on_train_end")
hook_cpu: dict[str, list] = {}  # "Class.hook": [thread CPU seconds, calls]


def time_distrain_hooks() -> None:
    """Wrap, in every CallbackList fit builds, each hook of the callbacks distrain added (those defined in its
    `entrypoint` package) with this thread's CPU clock. A hook timed in place pays what a hot loop does not (caches
    the step left cold, the all-reduces of the stop check, the checkpoint written)."""
    cls = tf.keras.callbacks.CallbackList
    original_init = cls.__init__

    def init(self, *a, **k):
        original_init(self, *a, **k)
        for callback in self.callbacks:
            if not type(callback).__module__.startswith("entrypoint"):
                continue
            for hook in HOOKS:
                method = getattr(callback, hook)
                if not getattr(method, "_is_default", False):  # the class's own, not Keras' inherited no-op
                    setattr(callback, hook, timed(method, f"{type(callback).__name__}.{hook}"))

    def timed(method, key):
        def call(*a, **k):
            began = time.thread_time()
            try:
                return method(*a, **k)
            finally:
                total = hook_cpu.setdefault(key, [0.0, 0])
                total[0] += time.thread_time() - began
                total[1] += 1
        return call

    cls.__init__ = init
    from entrypoint.fit import steps  # the step observers, called from the train function (steps.py), all in one

    steps.TrainingPosition.call_ended = timed(steps.TrainingPosition.call_ended, "TrainingPosition.call_ended")


if args.time_hooks:
    time_distrain_hooks()
stamps: list[float] = []
cpu_marks: dict[str, float] = {}  # the process's CPU seconds at marks of the run
main_marks: dict[str, float] = {}  # the main thread's (where fit's Python and the callbacks run)
epochs: list[float] = []


class Stamp(tf.keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        stamps.append(time.time())
        if len(stamps) == 1:
            cpu_marks["first_step"] = cpu_now()
            if args.gc_stats:
                gc_stats["tracked_at_first_step"] = len(gc.get_objects())
                gc_stats["collections_before"], gc_stats["cpu_s_before"] = [*gc_stats["collections"]], \
                    [*gc_stats["cpu_s"]]
        if len(stamps) == args.warmup:  # steady state from here (with --warmup 1 too, where it is the first step)
            cpu_marks["warmed_up"], main_marks["warmed_up"] = cpu_now(), time.thread_time()
        if len(stamps) == args.warmup + args.steps:
            cpu_marks["last_step"], main_marks["last_step"] = cpu_now(), time.thread_time()

    def on_epoch_begin(self, epoch, logs=None):
        self._began = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        epochs.append(time.perf_counter() - self._began)


callbacks = [Stamp()]
if hvd is not None:
    callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0), *callbacks]

if args.epochs:
    rng = np.random.default_rng(1)
    x = rng.random((args.samples, 32, 32, 3), dtype=np.float32)
    y = rng.integers(0, 10, args.samples)
    if hvd is None:
        model.fit(x, y, batch_size=args.batch, epochs=args.epochs, callbacks=callbacks, verbose=0)
    else:  # Horovod's examples: each rank its shard, per-rank batches
        shard = tf.data.Dataset.from_tensor_slices((x, y)).shard(size, rank).shuffle(args.samples // size, seed=rank)
        model.fit(shard.batch(args.batch // size), epochs=args.epochs, callbacks=callbacks, verbose=0)
    if rank == 0:
        print("BENCH " + json.dumps({"epoch_s": statistics.median(epochs[1:])}), flush=True)
else:
    batch = args.batch // size  # hand-written Horovod feeds per-rank batches; everything else the global batch
    model.fit(small_cnn.batches(tf, batch, args.warmup + args.steps), epochs=1, callbacks=callbacks, verbose=0)
    steps = [b - a for a, b in zip(stamps[args.warmup:], stamps[args.warmup + 1:])]
    if args.time_hooks:
        print("HOOKS " + json.dumps({"rank": rank, "cpu_s": cpu_now(), "hooks": hook_cpu}), flush=True)
    if args.gc_stats:
        print("GC " + json.dumps({"rank": rank, **gc_stats, "tracked_at_end": len(gc.get_objects())}), flush=True)
    if args.cpu_by_thread:
        print("THREADS " + json.dumps({"rank": rank, "script_start": SCRIPT_START_CPU, **cpu_marks,
                                         "main_thread_at": main_marks, **cpu_by_thread()}), flush=True)
    if rank == 0:
        print("BENCH " + json.dumps({"images_per_sec": args.batch / statistics.median(steps),
                                     "first_step": stamps[0], "process_start": process_start(),
                                     "script_start": SCRIPT_START, **distrain_phases(),
                                     "cpu_s_at": {"script_start": SCRIPT_START_CPU, **cpu_marks, "end": cpu_now()}}),
          flush=True)
