"""The training `distrain selftest` runs in each mode, as any user script runs: `fit` on numpy arrays, distributed by
distrain alone. Every rank draws its own data (as ranks reading their own shards do), so ranks that were not kept
in sync end with different weights. Each rank writes what the report judges to OUT/rank<r>.json: the loss
before and after, a digest of its final weights, what TensorFlow and Horovod say they run on, and (with a GPU)
the timings of float32, mixed precision and XLA side by side, and an all-reduce's bandwidth.

    distrain selftest-worker --out DIR     (what `distrain selftest` and jobs/selftest.job start per mode)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import time

import numpy as np
import tensorflow as tf

import entrypoint as distrain

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
parser.add_argument("--epochs", type=int, default=3)
args = parser.parse_args()

keras = tf.keras
keras.utils.set_random_seed(0)  # the same initial weights everywhere: a difference at the end is a sync failure
rank, size = distrain.rank(), distrain.size()
rng = np.random.default_rng(1000 + rank)
x = rng.normal(size=(256, 16)).astype("float32")
y = (x[:, :8].sum(axis=1) > x[:, 8:].sum(axis=1)).astype("int64")
model = keras.Sequential([keras.layers.Input((16,)), keras.layers.Dense(32, activation="relu"),
                          keras.layers.Dense(2)])
model.compile(optimizer=keras.optimizers.SGD(0.1), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
history = model.fit(x, y, batch_size=32, epochs=args.epochs, verbose=0)
losses = history.history["loss"]
weights = np.concatenate([w.ravel() for w in model.get_weights()])


def horovod_says() -> dict:
    if distrain.plan().mode != "horovod":
        return {}
    import horovod.tensorflow as hvd

    return {"horovod_controller": "mpi" if hvd.mpi_enabled() else "gloo" if hvd.gloo_enabled() else "?",
            "horovod_nccl_built": bool(hvd.nccl_built())}


def gpus_seen() -> list[dict]:
    """Each visible GPU as TensorFlow describes it, with its PCI bus id (which physical GPU this rank has)."""
    from tensorflow.python.client import device_lib

    found = []
    for device in device_lib.list_local_devices():
        if device.device_type == "GPU":
            desc = dict(part.split(": ", 1) for part in device.physical_device_desc.split(", ") if ": " in part)
            found.append({"name": desc.get("name", "GPU"), "pci_bus_id": desc.get("pci bus id", "?"),
                          "compute_capability": desc.get("compute capability", "?")})
    return found


def allreduce_bandwidth() -> dict:
    """Bus bandwidth of an all-reduce of 64 MiB of float32 between the ranks (nccl-tests' busbw formula)."""
    if size < 2:
        return {}
    count, repeats = 16 * 2**20, 5
    tensor = tf.ones([count], tf.float32)
    if distrain.plan().mode == "horovod":
        import horovod.tensorflow as hvd

        def reduce():
            return hvd.allreduce(tensor, op=hvd.Sum)
    else:
        strategy = distrain.strategy()

        @tf.function
        def reduce():
            return strategy.reduce("SUM", strategy.run(lambda: tf.identity(tensor)), axis=None)
    reduce().numpy()  # warm-up (and the first collective's set-up)
    start = time.perf_counter()
    for _ in range(repeats):
        reduce().numpy()
    seconds = (time.perf_counter() - start) / repeats
    algbw = count * 4 / seconds / 1e9
    return {"allreduce_busbw_gbs": algbw * 2 * (size - 1) / size, "allreduce_mib": 64}


def gpu_speeds() -> dict:
    """Images/s of a small CNN in float32, mixed float16, mixed bfloat16 (compute capability >= 8) and XLA,
    measured one after the other in this process on this rank's GPU."""
    if rank != 0 or not tf.config.list_physical_devices("GPU") or size > 1:
        return {}
    from entrypoint.tools import bench

    engine = distrain._engine()
    speeds = {}
    capability = tf.config.experimental.get_device_details(tf.config.list_physical_devices("GPU")[0]).get(
        "compute_capability", (0, 0))
    variants = {"float32": {}, "mixed_float16": {"mixed_precision": True}, "xla": {"xla": True}}
    for name, options in variants.items():
        keras.mixed_precision.set_global_policy("float32")
        result = bench.run_bench(engine, bench.BenchConfig(steps=30, warmup=5, **options))
        speeds[name] = result.images_per_sec
    if tuple(capability) >= (8, 0):
        keras.mixed_precision.set_global_policy("mixed_bfloat16")
        speeds["mixed_bfloat16"] = bench.run_bench(engine, bench.BenchConfig(steps=30, warmup=5)).images_per_sec
    keras.mixed_precision.set_global_policy("float32")
    memory_growth = all(tf.config.experimental.get_memory_growth(g) for g in tf.config.list_physical_devices("GPU"))
    return {"images_per_sec": speeds, "memory_growth": memory_growth}


build = tf.sysconfig.get_build_info()
result = {
    "rank": rank, "size": size, "mode": distrain.plan().mode,
    "host": os.environ.get("SLURMD_NODENAME") or platform.node(),  # Slurm's node name, as the job shows it
    "machine": platform.node(),  # emulated Slurm nodes share one machine: no network between them
    "loss_first": float(losses[0]), "loss_last": float(losses[-1]),
    "weights": hashlib.sha256(weights.tobytes()).hexdigest()[:16],
    "tensorflow": tf.__version__, "keras": keras.__name__.split(".")[0],
    "cuda_build": bool(build.get("is_cuda_build", False)), "cuda_version": build.get("cuda_version") or "",
    "gpus": gpus_seen(), "replicas": distrain.strategy().num_replicas_in_sync,
    **horovod_says(), **allreduce_bandwidth(), **gpu_speeds(),
}
os.makedirs(args.out, exist_ok=True)
path = os.path.join(args.out, f"rank{rank}.json")
with open(path + ".tmp", "w") as handle:
    json.dump(result, handle)
os.replace(path + ".tmp", path)
