"""All-reduce time against tensor size, through distrain's engine (MWM or Horovod, whichever the Plan says), and
under MWM the stop check's CPU per call: distrain's way (StrategyEngine.sum_over_ranks) against the public
tf.function way (engines/strategy.in_graph_sum), in alternating rounds, with a pause between calls as in training.

    distrain launch -n 2 benchmarks/workers/allreduce.py            (MWM, DISTRAIN_COLLECTIVE=ring)
    horovodrun -np 2 --gloo distrain run benchmarks/workers/allreduce.py
"""

import argparse
import json
import statistics
import time

import entrypoint as dt
from entrypoint.engines import strategy as strategy_engine

# isort: split
import tensorflow as tf

parser = argparse.ArgumentParser()
parser.add_argument("--sizes", default="1000,100000,1000000,4000000", help="float32 elements")
parser.add_argument("--reps", type=int, default=10)
parser.add_argument("--stop-checks", type=int, default=100, help="calls per way and round (MWM); 0: none")
args = parser.parse_args()

sizes = [int(s) for s in args.sizes.split(",")]
timings = {}
if dt.plan().mode == "horovod":
    import horovod.tensorflow as hvd

    def reduce_once(tensor):
        return hvd.allreduce(tensor, op=hvd.Sum)
else:
    reduce_once = strategy_engine.in_graph_sum(dt.strategy(), tf)  # the strategy's public sum, in a tf.function

for size in sizes:
    tensor = tf.ones((size,), tf.float32)
    reduce_once(tensor).numpy()  # warm-up (graph build, connection set-up)
    samples = []
    for _ in range(args.reps):
        start = time.perf_counter()
        reduce_once(tensor).numpy()
        samples.append(time.perf_counter() - start)
    timings[size] = 1000 * statistics.median(samples)


def stop_check_cpu(calls: int, rounds: int = 3) -> dict:
    """Process CPU ms per call (all threads: the collective's work is on TensorFlow's), per way, median of rounds."""
    from entrypoint.runtime import setup

    ours = setup().sum_over_ranks()
    ways = {"distrain": ours, "tf.function": strategy_engine.public_sum_over_ranks(dt.strategy(), tf)}
    per_call: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(rounds):
        for name, check in ways.items():
            check([1.0, 2.0, 3.0, 4.0])  # tracing, first key
            before = time.process_time()
            for _ in range(calls):
                check([1.0, 2.0, 3.0, 4.0])
                time.sleep(0.01)  # a step between checks: no back-to-back batching of calls
            per_call[name].append(1000 * (time.process_time() - before) / calls)
    medians = {name: statistics.median(values) for name, values in per_call.items()}
    return {**{f"{name}_cpu_ms": value for name, value in medians.items()},
            "ratio": medians["tf.function"] / medians["distrain"], "distrain_way": ours.__name__}


checks = stop_check_cpu(args.stop_checks) if args.stop_checks and dt.plan().mode == "mwm" else None
if dt.is_chief():
    print("ALLREDUCE " + json.dumps({"mode": dt.plan().mode, "ms": timings, "stop_check": checks}), flush=True)
