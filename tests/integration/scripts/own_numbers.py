"""Numbers a script prints, for comparison with plain `python` on the same global batches (#67): two models
trained one after the other (each model's metrics must be its own, not the first model's), then gradient
clipping in each of Keras' three forms (it must act on the global batch's gradients, not each replica's).

Each scenario is reseeded and prints one line, `NUMBERS name=... fit=... evaluate=...`: the last epoch's loss
and metric from fit's History and `evaluate`'s, to 5 decimals. Every input is unshuffled, so the global batches
are the same in one process and in N.
"""
import sys

import numpy as np
import tensorflow as tf

keras = tf.keras
SAMPLES, FEATURES, BATCH, EPOCHS = 256, 16, 32, 2
rng = np.random.default_rng(7)
x = rng.normal(size=(SAMPLES, FEATURES)).astype("float32")
y = (x[:, :4].sum(axis=1) > 0).astype("int64")


def model_with(optimizer):  # noqa: ANN001, ANN201
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.layers.Input((FEATURES,)), keras.layers.Dense(8, activation="relu"),
                              keras.layers.Dense(2)])
    model.compile(optimizer, keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    return model


def report(name: str, history, evaluated) -> None:  # noqa: ANN001
    fit = "/".join(f"{history.history[key][-1]:.5f}" for key in ("loss", "accuracy"))
    print(f"NUMBERS name={name} fit={fit} evaluate={'/'.join(f'{v:.5f}' for v in evaluated)}", flush=True)


def dataset():  # noqa: ANN201
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)


# a learning-rate loop: the second model's numbers are its own
for learning_rate in (0.01, 0.5):
    model = model_with(keras.optimizers.SGD(learning_rate))
    history = model.fit(x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0)
    report(f"sgd_{learning_rate}", history, model.evaluate(x, y, batch_size=BATCH, verbose=0))

clipping = {"clipnorm": 0.05, "clipvalue": 0.01, "global_clipnorm": 0.05}
for form in [a for a in sys.argv[1:] if a in clipping] or clipping:
    model = model_with(keras.optimizers.Adam(0.01, **{form: clipping[form]}))
    history = model.fit(dataset(), epochs=EPOCHS, verbose=0)
    report(form, history, model.evaluate(dataset(), verbose=0))
