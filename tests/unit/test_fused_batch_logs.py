"""Zero-code Horovod averages each step's logs within the gradients' all-reduce (compat/horovod_fused_logs.py):
the update waits for the step's logs, the same update with the same gradients; the logs' all-reduce does not wait
for the update. One process here (Horovod's size 1: every mean is the value itself); the two-rank numbers against
plain python are the conformance suite's (BatchLosses under Horovod, both families)."""

import numpy as np
import pytest

from entrypoint.compat import horovod_fused_logs, keras3_horovod


@pytest.fixture(scope="module")
def hvd():
    hvd = pytest.importorskip("horovod.tensorflow")
    hvd.init()
    return hvd


def data():
    rng = np.random.default_rng(0)
    return rng.standard_normal((64, 8)).astype("float32"), rng.standard_normal((64, 1)).astype("float32")


INITIAL = {}  # each family's first model's weights, given to the next: no seed set (test_own_shards reads it unset)


def model_of(keras, optimizer):
    model = keras.Sequential([keras.layers.Input((8,)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(1)])
    model.compile(optimizer=optimizer, loss="mse", metrics=["mae"])
    model.set_weights(INITIAL.setdefault(keras.__name__, model.get_weights()))
    return model


def trained(keras, optimizer, fused, hvd, horovod_keras_api):
    import tensorflow as tf

    model = model_of(keras, optimizer)
    if fused:
        assert horovod_fused_logs.fusable(model, keras.Model.train_step, horovod_keras_api)
        horovod_fused_logs.install(model, tf, hvd, horovod_keras_api)
    losses = []
    callback = keras.callbacks.LambdaCallback(on_train_batch_end=lambda batch, logs: losses.append(logs["loss"]))
    x, y = data()
    model.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0, callbacks=[callback])
    return losses, [np.array(w) for w in model.weights], model


def test_keras3_the_fused_step_trains_and_logs_as_the_step_it_replaces(hvd):
    keras = pytest.importorskip("keras")
    if not keras.__version__.startswith("3."):
        pytest.skip("Keras 3")
    plain = trained(keras, keras3_horovod.wrap_optimizer(keras.optimizers.Adam(), hvd), False, hvd, False)
    fused = trained(keras, keras3_horovod.wrap_optimizer(keras.optimizers.Adam(), hvd), True, hvd, False)
    assert plain[0] == fused[0] and len(fused[0]) == 8
    assert all(np.array_equal(a, b) for a, b in zip(plain[1], fused[1], strict=True))
    assert "apply" not in vars(fused[2].optimizer) or fused[2].optimizer.apply.__name__ == "apply"  # distrain's own


def test_tf_keras_the_fused_step_trains_and_logs_as_the_step_it_replaces(hvd):
    tf_keras = pytest.importorskip("tf_keras")
    hvd_keras = pytest.importorskip("horovod.tensorflow.keras")

    def wrapped():
        optimizer = hvd_keras.DistributedOptimizer(tf_keras.optimizers.Adam())
        optimizer._distrain_wrapped = True
        return optimizer

    plain = trained(tf_keras, wrapped(), False, hvd, True)
    fused = trained(tf_keras, wrapped(), True, hvd, True)
    assert plain[0] == fused[0] and len(fused[0]) == 8
    assert all(np.array_equal(a, b) for a, b in zip(plain[1], fused[1], strict=True))
    assert "apply_gradients" not in vars(fused[2].optimizer)  # Horovod's own again outside the step


def test_a_scripts_own_train_step_or_optimizer_is_not_fused(hvd):
    keras = pytest.importorskip("keras")
    if not keras.__version__.startswith("3."):
        pytest.skip("Keras 3")

    class OwnStep(keras.Sequential):
        def train_step(self, data):  # noqa: ANN001, ANN201 - a GAN's reads its weights after its first update
            return super().train_step(data)

    model = model_of(keras, keras3_horovod.wrap_optimizer(keras.optimizers.Adam(), hvd))
    assert horovod_fused_logs.fusable(model, keras.Model.train_step, False)
    own = OwnStep([keras.layers.Input((8,)), keras.layers.Dense(1)])
    own.compile(optimizer=keras3_horovod.wrap_optimizer(keras.optimizers.Adam(), hvd), loss="mse")
    assert not horovod_fused_logs.fusable(own, keras.Model.train_step, False)
    assert not horovod_fused_logs.fusable(model_of(keras, keras.optimizers.Adam()), keras.Model.train_step, False)
