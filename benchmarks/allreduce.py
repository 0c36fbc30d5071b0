"""All-reduce time against tensor size, through distrain's engine (MWM or Horovod, whichever the Plan says).

    distrain launch -n 2 benchmarks/allreduce.py            (MWM, DISTRAIN_COLLECTIVE=ring)
    horovodrun -np 2 --gloo distrain run benchmarks/allreduce.py
"""

import argparse
import json
import statistics
import time

import entrypoint as dt

# isort: split
import tensorflow as tf

parser = argparse.ArgumentParser()
parser.add_argument("--sizes", default="1000,100000,1000000,4000000", help="float32 elements")
parser.add_argument("--reps", type=int, default=10)
args = parser.parse_args()

sizes = [int(s) for s in args.sizes.split(",")]
timings = {}
if dt.plan().mode == "horovod":
    import horovod.tensorflow as hvd

    def reduce_once(tensor):
        return hvd.allreduce(tensor, op=hvd.Sum)
else:
    strategy = dt.strategy()

    @tf.function
    def reduce_once(tensor):
        return strategy.reduce("SUM", strategy.run(lambda: tf.identity(tensor)), axis=None)

for size in sizes:
    tensor = tf.ones((size,), tf.float32)
    reduce_once(tensor).numpy()  # warm-up (graph build, connection set-up)
    samples = []
    for _ in range(args.reps):
        start = time.perf_counter()
        reduce_once(tensor).numpy()
        samples.append(time.perf_counter() - start)
    timings[size] = 1000 * statistics.median(samples)
if dt.is_chief():
    print("ALLREDUCE " + json.dumps({"mode": dt.plan().mode, "ms": timings}), flush=True)
