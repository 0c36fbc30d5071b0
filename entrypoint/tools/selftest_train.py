"""The training `distrain selftest` runs in each mode, as any user script runs: `fit` on a `tf.data` dataset,
distributed by distrain alone. Every rank makes the same dataset, so N ranks train the same global batches as
the one-process run of the same selftest, which is the reference: two models one after the other (each judged
on its own numbers), in float32 (TF32 off) and, on a GPU, in mixed precision and with XLA. Each rank writes what
the report judges to OUT/rank<r>.json: each model's loss per epoch, `evaluate`, a digest of its final weights, the
samples this rank trained (the work split), the first non-finite loss or weight; rank 0 also its weights after
every step (OUT/rank0-steps.npz), for tools/selftest_arithmetic to name the first step and variable that differ.
Also what TensorFlow and Horovod say they run on and (with a GPU) the timings of float32, mixed precision and
XLA side by side, and an all-reduce's bandwidth.

    distrain selftest-worker --out DIR     (what `distrain selftest` and jobs/selftest.job start per mode)

DISTRAIN_SELFTEST_FAULT (the tests' negative control, read here only): `scale-rank-1` doubles rank 1's loss,
`sum` multiplies every rank's by the number of ranks (a sum where a mean belongs); the ranks stay in sync, and
only the comparison with one process can tell.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import platform
import time

import numpy as np
import tensorflow as tf

import entrypoint as distrain

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
parser.add_argument("--epochs", type=int, default=2)
args = parser.parse_args()

keras = tf.keras
SAMPLES, GLOBAL_BATCH = 256, 32
FAULT = os.environ.get("DISTRAIN_SELFTEST_FAULT", "")
tf.config.experimental.enable_tensor_float_32_execution(False)  # float32 is float32 on GPUs that have TF32
rank, size = distrain.rank(), distrain.size()
rng = np.random.default_rng(1000)  # the same data on every rank: one process's global batches
x = rng.normal(size=(SAMPLES, 16)).astype("float32")
y = (x[:, :8].sum(axis=1) > x[:, 8:].sum(axis=1)).astype("int64")
trained_samples = [0]


def count(batch):  # noqa: ANN001, ANN201
    trained_samples[0] += len(batch)
    return np.int64(len(batch))


class CountSamples(keras.layers.Layer):
    """An identity that counts the samples this rank trains on: ranks that each train every sample are not
    splitting the work, whatever their numbers say."""

    def call(self, inputs, training=None):  # noqa: ANN001, ANN201
        if training:
            counted = tf.numpy_function(count, [inputs], tf.int64, stateful=True)
            with tf.control_dependencies([counted]):
                inputs = tf.identity(inputs)
        return inputs

    def compute_output_shape(self, input_shape):  # noqa: ANN001, ANN201
        return input_shape


class StepWeights(keras.callbacks.Callback):
    """The weights after every step (rank 0 keeps them) and the first non-finite loss or weight (every rank)."""

    def __init__(self, keep: bool) -> None:
        super().__init__()
        self.keep, self.steps, self.nonfinite, self.step = keep, [], None, 0

    def on_train_batch_end(self, batch, logs=None):  # noqa: ANN001
        self.step += 1
        weights = np.concatenate([w.ravel() for w in self.model.get_weights()]).astype("float64")
        if self.keep:
            self.steps.append(weights)
        loss = float((logs or {}).get("loss", 0.0))
        if self.nonfinite is None and not (math.isfinite(loss) and np.isfinite(weights).all()):
            self.nonfinite = f"step {self.step}: {'loss' if not math.isfinite(loss) else 'weights'} not finite"


def loss_function():  # noqa: ANN201
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    factor = {"sum": float(size), "scale-rank-1": 2.0 if rank == 1 else 1.0}.get(FAULT, 1.0)
    if factor == 1.0:
        return loss
    def scaled(y_true, y_pred):  # noqa: ANN001, ANN202 - per sample, as Keras' own loss functions
        return keras.losses.sparse_categorical_crossentropy(y_true, y_pred, from_logits=True) * factor

    return scaled


def why(exc: Exception) -> str:
    """One line of an error: TensorFlow's graph errors say the reason last, after the trace of the node."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    reasons = [line for line in lines if not line.startswith(("Graph execution error", "Detected at node", "File",
                                                               "[[", "[Op:"))]
    return (reasons[-1] if reasons else lines[-1] if lines else "")[:300]


def variants() -> list[str]:
    return ["float32", "mixed_float16", "xla"] if tf.config.list_physical_devices("GPU") else ["float32"]


def train(variant: str, optimizer, seed: int) -> tuple[dict, np.ndarray, list]:  # noqa: ANN001
    keras.mixed_precision.set_global_policy("mixed_float16" if variant == "mixed_float16" else "float32")
    keras.utils.set_random_seed(seed)  # the same initial weights everywhere
    counting = [] if variant == "xla" else [CountSamples()]  # numpy_function has no XLA kernel
    model = keras.Sequential([keras.layers.Input((16,)), *counting, keras.layers.Dense(32, activation="relu"),
                              keras.layers.Dense(2, dtype="float32")])
    model.compile(optimizer=optimizer, loss=loss_function(), metrics=["accuracy"], jit_compile=variant == "xla")
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH)
    before, steps = trained_samples[0], StepWeights(keep=rank == 0)
    history = model.fit(data, epochs=args.epochs, verbose=0, callbacks=[steps])
    evaluated = model.evaluate(data, verbose=0)
    weights = np.concatenate([w.ravel() for w in model.get_weights()])
    layout = [[w.path if hasattr(w, "path") else w.name, int(np.prod(w.shape))] for w in model.weights]
    keras.mixed_precision.set_global_policy("float32")
    return ({"loss": [float(v) for v in history.history["loss"]], "evaluate": [float(v) for v in evaluated],
             "weights": hashlib.sha256(weights.tobytes()).hexdigest()[:16], "nonfinite": steps.nonfinite,
             "samples": None if variant == "xla" else trained_samples[0] - before, "layout": layout},
            weights, steps.steps)


models, finals, per_step = {}, [], {}
for variant in variants():
    # Adam is left out: its step divides by the gradient's own size, so where a gradient is near zero the order of
    # the all-reduce's sums moves a weight by up to the learning rate, and no tolerance tells that from a fault
    for name, optimizer, seed in (("sgd", keras.optimizers.SGD(0.1), 0),
                                  ("momentum", keras.optimizers.SGD(0.05, momentum=0.9), 1)):
        key = f"{variant}/{name}"
        try:
            models[key], final, steps = train(variant, optimizer, seed)
        except Exception as exc:  # noqa: BLE001 - a GPU variant that fails is its row's finding, not the mode's end
            if variant == "float32":
                raise
            keras.mixed_precision.set_global_policy("float32")
            models[key] = {"error": f"{type(exc).__name__}: {why(exc)}"}
            continue
        finals.append(final)
        if steps:
            per_step[key] = np.stack(steps)
first = models["float32/sgd"]


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
    "host": distrain.plan().node,  # Slurm's node name, as the job shows it
    "machine": platform.node(),  # emulated Slurm nodes share one machine: no network between them
    "loss_first": first["loss"][0], "loss_last": first["loss"][-1],
    "weights": hashlib.sha256(np.concatenate(finals).tobytes()).hexdigest()[:16], "models": models,
    "tensorflow": tf.__version__, "keras": keras.__name__.split(".")[0],
    "cuda_build": bool(build.get("is_cuda_build", False)), "cuda_version": build.get("cuda_version") or "",
    "gpus": gpus_seen(), "replicas": distrain.strategy().num_replicas_in_sync,
    **horovod_says(), **allreduce_bandwidth(), **gpu_speeds(),
}
os.makedirs(args.out, exist_ok=True)
if per_step:
    np.savez(os.path.join(args.out, f"rank{rank}-steps.npz"), **{k.replace("/", "__"): v for k, v in per_step.items()})
path = os.path.join(args.out, f"rank{rank}.json")
with open(path + ".tmp", "w") as handle:
    json.dump(result, handle)
os.replace(path + ".tmp", path)
