"""`distrain bench`: synthetic-data training throughput in whatever mode the Plan says.

Reports what Horovod's and tf_cnn_benchmarks' reports use: images/second, in total and per replica, with warm-up
steps excluded, step-time percentiles, and scaling efficiency against a single-replica baseline result.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from ..engines import Engine

MODELS = {"small_cnn": (32, 10), "resnet50": (224, 1000)}  # default image size, classes


@dataclass
class BenchConfig:
    model: str = "small_cnn"
    batch_per_replica: int = 32
    steps: int = 50
    warmup: int = 10
    image_size: int | None = None
    xla: bool = False
    mixed_precision: bool = False


@dataclass
class BenchResult:
    config: dict
    mode: str
    workers: int
    replicas: int
    global_batch: int
    images_per_sec: float
    images_per_sec_per_replica: float
    step_ms_p50: float
    step_ms_p90: float
    step_ms_p99: float
    scaling_efficiency: float | None = None
    device: str = ""
    host: str = field(default_factory=platform.node)
    tensorflow: str = ""


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def _model(keras: Any, name: str, size: int, classes: int) -> Any:
    if name == "resnet50":
        return keras.applications.ResNet50(weights=None, input_shape=(size, size, 3), classes=classes)
    layers = keras.layers
    return keras.Sequential([
        layers.Input((size, size, 3)),
        layers.Conv2D(32, 3, activation="relu"), layers.MaxPooling2D(),
        layers.Conv2D(64, 3, activation="relu"), layers.MaxPooling2D(),
        layers.Flatten(), layers.Dense(128, activation="relu"), layers.Dense(classes),
    ])


def run_bench(engine: Engine, config: BenchConfig, baseline: dict | None = None) -> BenchResult:
    """Train on synthetic data for warmup + steps; time each step after the warm-up on every rank."""
    tf, keras = engine.tf, engine.keras
    if config.model not in MODELS:
        from ..errors import ConfigError

        raise ConfigError(f"unknown model {config.model!r}: use one of {', '.join(MODELS)}")
    size, classes = MODELS[config.model]
    size = config.image_size or size
    if config.mixed_precision:
        keras.mixed_precision.set_global_policy("mixed_float16")
    strategy = engine.strategy or tf.distribute.get_strategy()
    replicas = engine.replicas
    global_batch = config.batch_per_replica * replicas
    # what fit() receives: the global batch under tf.distribute (split across replicas), one rank's under Horovod
    fed_batch = engine.batch_fit_receives(global_batch)
    images = tf.random.uniform((fed_batch, size, size, 3), seed=engine.rank)
    labels = tf.random.uniform((fed_batch,), maxval=classes, dtype=tf.int32, seed=engine.rank)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    dataset = tf.data.Dataset.from_tensors((images, labels)).repeat().with_options(options)
    with strategy.scope():
        model = _model(keras, config.model, size, classes)
        model.compile(optimizer=keras.optimizers.SGD(0.01, momentum=0.9), jit_compile=config.xla,
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    times: list[float] = []

    class StepTimer(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
            self.start = time.perf_counter()

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:  # logs as numpy: the step finished
            if batch >= config.warmup:
                times.append(time.perf_counter() - self.start)

    model.fit(dataset, epochs=1, steps_per_epoch=config.warmup + config.steps, callbacks=[StepTimer()], verbose=0)
    step = statistics.median(times)
    throughput = global_batch / step
    gpus = tf.config.list_physical_devices("GPU")
    device = tf.config.experimental.get_device_details(gpus[0]).get("device_name", "GPU") if gpus else "CPU"
    efficiency = None
    if baseline:
        per_replica_base = baseline["images_per_sec"] / baseline["replicas"]
        efficiency = (throughput / replicas) / per_replica_base
    return BenchResult(
        config=asdict(config), mode=engine.plan.mode, workers=engine.size, replicas=replicas,
        global_batch=global_batch, images_per_sec=throughput, images_per_sec_per_replica=throughput / replicas,
        step_ms_p50=1000 * step, step_ms_p90=1000 * _percentile(times, 0.9),
        step_ms_p99=1000 * _percentile(times, 0.99),
        scaling_efficiency=efficiency, device=device, tensorflow=tf.__version__,
    )


def table(result: BenchResult) -> str:
    rows = [
        ("model", f"{result.config['model']} ({'XLA' if result.config['xla'] else 'no XLA'}, "
                  f"{'mixed fp16' if result.config['mixed_precision'] else 'fp32'})"),
        ("mode", f"{result.mode}, {result.workers} worker(s), {result.replicas} replica(s) on {result.device}"),
        ("global batch", str(result.global_batch)),
        ("images/sec", f"{result.images_per_sec:.1f} total, {result.images_per_sec_per_replica:.1f} per replica"),
        ("step time", f"p50 {result.step_ms_p50:.1f} ms, p90 {result.step_ms_p90:.1f} ms, "
                      f"p99 {result.step_ms_p99:.1f} ms"),
    ]
    if result.scaling_efficiency is not None:
        rows.append(("scaling efficiency", f"{100 * result.scaling_efficiency:.1f}% of the single-replica baseline"))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def write_json(result: BenchResult, path: str) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path + ".tmp", "w") as handle:
        json.dump(asdict(result), handle, indent=2)
    os.replace(path + ".tmp", path)


def read_json(path: str) -> dict:
    with open(path) as handle:
        return json.load(handle)


def plot(results: list[str], out: str) -> None:
    """Throughput against replica count (and ideal linear scaling) from several JSON results, to a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = sorted((read_json(p) for p in results), key=lambda r: r["replicas"])
    replicas = [r["replicas"] for r in data]
    throughput = [r["images_per_sec"] for r in data]
    base = throughput[0] / replicas[0]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(replicas, throughput, "o-", label="measured")
    ax.plot(replicas, [base * n for n in replicas], "--", color="gray", label="linear scaling")
    ax.set_xticks(replicas)
    ax.set_xlabel("replicas")
    ax.set_ylabel("images/sec")
    ax.set_title(f"distrain bench: {data[0]['config']['model']} on {data[0]['device']}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=100)
