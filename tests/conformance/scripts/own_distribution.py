"""The script's own distribution code as TensorFlow's tutorials write it, one kind a launch (each configures the
process), printing keras_surface.py's `CONFORM` lines:

- `devices`: TensorFlow's "Distributed input" set-up, the CPU split into two logical devices (and GPUs hidden)
  before anything else, then a Keras model trained in the script's own MirroredStrategy over them;
- `one_device`: the same script's MirroredStrategy over one device: the reference where Keras 3.3's own
  MirroredStrategy sums its replicas' gradients (keras#19969), so plain python's split run is not the script's
  numbers there;
- `parameter_server`: TensorFlow's parameter server training tutorial, its in-process cluster (one worker, one
  parameter server) and a ClusterCoordinator loop; not caught: under distrain's ranks it is refused, one line.

    python own_distribution.py OUT_DIR [--keras legacy] devices|one_device|parameter_server
"""
import socket
import sys

import tensorflow as tf

KIND = sys.argv[-1]
if KIND == "devices":  # before TensorFlow starts, as the tutorial does
    tf.config.set_logical_device_configuration(tf.config.list_physical_devices("CPU")[0],
                                               [tf.config.LogicalDeviceConfiguration()] * 2)
    tf.config.set_visible_devices([], "GPU")

import keras_surface as surface  # noqa: E402 - after the device configuration, which must come first


def own_mirrored_strategy(devices: list[str]) -> dict:
    strategy = tf.distribute.MirroredStrategy(devices)
    with strategy.scope():
        model = surface.classifier()
    return surface.fitted(model, model.fit(surface.dataset(), epochs=2, verbose=0))


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("localhost", 0))
        return probe.getsockname()[1]


def parameter_server() -> dict:
    """The tutorial's in-process cluster and a custom loop: a linear model's variables on the parameter server."""
    ports = [free_port(), free_port()]
    cluster = tf.train.ClusterSpec({"worker": [f"localhost:{ports[0]}"], "ps": [f"localhost:{ports[1]}"]})
    tf.distribute.Server(cluster, job_name="worker", task_index=0, protocol="grpc")
    tf.distribute.Server(cluster, job_name="ps", task_index=0, protocol="grpc")
    strategy = tf.distribute.ParameterServerStrategy(
        tf.distribute.cluster_resolver.SimpleClusterResolver(cluster, rpc_layer="grpc"))
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    with strategy.scope():
        weights, bias = tf.Variable(tf.zeros((surface.FEATURES, 1))), tf.Variable(0.0)
    targets = surface.y.astype("float32")[:, None]
    batches = coordinator.create_per_worker_dataset(
        lambda: tf.data.Dataset.from_tensor_slices((surface.x, targets)).batch(surface.BATCH).repeat())
    iterator = iter(batches)

    @tf.function
    def step(iterator: object) -> tf.Tensor:
        def replica(features: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean((features @ weights + bias - labels) ** 2)
            for variable, gradient in zip((weights, bias), tape.gradient(loss, (weights, bias))):
                variable.assign_sub(0.05 * gradient)
            return loss

        return strategy.run(replica, args=next(iterator))

    losses = [coordinator.schedule(step, args=(iterator,)) for _ in range(16)]
    coordinator.join()
    return {"loss": surface.numbers([losses[-1].fetch()]),
            "weights": surface.numbers([tf.reduce_sum(weights).numpy(), bias.numpy()])}


if __name__ == "__main__":
    if KIND == "parameter_server":
        print("CONFORM name=parameter_server " + " ".join(
            f"{k}={v}" for k, v in {"status": "ok", **parameter_server()}.items()), flush=True)
    else:
        chosen = [d.name for d in tf.config.list_logical_devices("CPU")] if KIND == "devices" else ["/cpu:0"]
        surface.SCENARIOS["own_mirrored_strategy"] = lambda out: own_mirrored_strategy(chosen)
        surface.run(["own_mirrored_strategy"])
