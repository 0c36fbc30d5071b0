"""Keras' public surface as small scenarios, written as a user writes them: each reseeded, each printing one line
`CONFORM name=... key=value ...` (History's losses, `evaluate`, `predict`, the weights, the files it left), so that
plain `python` and every distrain mode can be compared on the same global batches (tests/conformance).

    python keras_surface.py OUT_DIR [--keras legacy] [scenario ...]

Every input is unshuffled or a seeded tf.data pipeline, so the global batches are the same in one process and in N.
Each scenario catches its own failure (`status=error:...`); one that runs past DEADLINE_SECONDS ends the process
with `status=timeout` (a collective that never completes cannot be caught).
"""
import faulthandler
import inspect
import json
import multiprocessing
import os
import sys
import threading
import time
import traceback

import numpy as np

if "--keras" in sys.argv and sys.argv[sys.argv.index("--keras") + 1] == "legacy":
    import tf_keras as keras
else:
    import keras
import tensorflow as tf

DEADLINE_SECONDS = 120
SAMPLES, FEATURES, BATCH = 256, 16, 32
OUT = os.path.abspath(sys.argv[1])
RANK = int(os.environ.get("OMPI_COMM_WORLD_RANK")
           or json.loads(os.environ.get("TF_CONFIG") or "{}").get("task", {}).get("index", 0))
WORKERS = len(json.loads(os.environ.get("TF_CONFIG") or "{}").get("cluster", {}).get("worker", [0]))
data = np.random.default_rng(7)
x = data.normal(size=(SAMPLES, FEATURES)).astype("float32")
y = (x[:, :4].sum(axis=1) > 0).astype("int64")
x_val, y_val = x[:64] * 0.9, y[:64]
SCENARIOS = {}


def scenario(function):  # noqa: ANN001, ANN201
    SCENARIOS[function.__name__] = function
    return function


def numbers(values) -> str:  # noqa: ANN001
    return ",".join(repr(float(v)) for v in np.ravel(values))


def weights(model) -> str:  # noqa: ANN001
    flat = np.concatenate([np.ravel(w) for w in model.get_weights()])
    return numbers([flat.sum(), np.abs(flat).sum()])


def files(directory: str) -> str:
    found = []
    for parent, _, names in os.walk(directory):
        for name in names:
            path = os.path.relpath(os.path.join(parent, name), directory)
            found.append("events.out.tfevents" if "events.out.tfevents" in name else path.replace(os.sep, "/"))
    return ";".join(sorted(found)) or "-"


def classifier(optimizer="adam", **compile_args):  # noqa: ANN001, ANN003, ANN201
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(8, activation="relu"),
                              keras.layers.Dense(2)])
    model.compile(optimizer, keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"],
                  **compile_args)
    return model


def dataset(batch: int = BATCH):  # noqa: ANN201
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(batch)


def fitted(model, history, **extra) -> dict:  # noqa: ANN001, ANN003
    """What every scenario reports of a model it trained."""
    return {"loss": numbers(history.history["loss"]),
            "evaluate": numbers(model.evaluate(x, y, batch_size=BATCH, verbose=0)),
            "predict": numbers(np.sum(model.predict(x[:64], batch_size=BATCH, verbose=0))),
            "weights": weights(model), **extra}


@scenario
def learning_rate_loop(out: str) -> dict:
    """Two models one after the other: the second one's numbers are its own."""
    result = {}
    for index, learning_rate in enumerate((0.01, 0.5)):
        model = classifier(keras.optimizers.SGD(learning_rate))
        history = model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
        result.update({f"{key}{index}": value for key, value in fitted(model, history).items()})
    return result


def clipped(form: str, value: float) -> dict:
    model = classifier(keras.optimizers.Adam(0.01, **{form: value}))
    return fitted(model, model.fit(dataset(), epochs=2, verbose=0))


@scenario
def clipnorm(out: str) -> dict:
    return clipped("clipnorm", 0.05)


@scenario
def clipvalue(out: str) -> dict:
    return clipped("clipvalue", 0.01)


@scenario
def global_clipnorm(out: str) -> dict:
    return clipped("global_clipnorm", 0.05)


@scenario
def builtin_callbacks(out: str) -> dict:
    """Keras' own callbacks together, their files in one directory, the best model loaded back."""
    model = classifier(keras.optimizers.Adam(0.02))
    callbacks = [
        keras.callbacks.ModelCheckpoint(os.path.join(out, "best.keras"), monitor="val_loss", save_best_only=True),
        keras.callbacks.ModelCheckpoint(os.path.join(out, "w-{epoch:02d}.weights.h5"), save_weights_only=True),
        keras.callbacks.CSVLogger(os.path.join(out, "log.csv")),
        keras.callbacks.EarlyStopping(monitor="val_loss", patience=1, restore_best_weights=True),
        keras.callbacks.ReduceLROnPlateau(monitor="loss", patience=1, factor=0.5),
        keras.callbacks.LearningRateScheduler(lambda epoch, lr: lr * 0.9),
        keras.callbacks.TerminateOnNaN(),
        keras.callbacks.LambdaCallback(on_epoch_end=lambda epoch, logs: None),
        keras.callbacks.TensorBoard(os.path.join(out, "tb")),
    ]
    history = model.fit(x, y, batch_size=BATCH, epochs=5, shuffle=False, validation_data=(x_val, y_val),
                        callbacks=callbacks, verbose=0)
    best = keras.models.load_model(os.path.join(out, "best.keras"))
    with open(os.path.join(out, "log.csv")) as handle:
        rows = len(handle.read().splitlines())
    return fitted(model, history, val_loss=numbers(history.history["val_loss"]),
                  best=numbers(best.evaluate(x_val, y_val, batch_size=BATCH, verbose=0)), csv_rows=rows,
                  files=files(out))


@scenario
def save_then_load(out: str) -> dict:
    """A curriculum in phases: each phase's model saved, loaded back (by every process) and trained on."""
    model = classifier()
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    model.save(os.path.join(out, "phase1.keras"))
    model = keras.models.load_model(os.path.join(out, "phase1.keras"))
    history = model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    model.save_weights(os.path.join(out, "phase2.weights.h5"))
    again = classifier()
    again.load_weights(os.path.join(out, "phase2.weights.h5"))
    return fitted(model, history, reloaded=numbers(again.evaluate(x, y, batch_size=BATCH, verbose=0)),
                  files=files(out))


@scenario
def kfold_best_checkpoints(out: str) -> dict:
    """k-fold as users write it: each fold in a fresh session (clear_session), its best epoch kept by
    ModelCheckpoint(save_best_only=True) and loaded back for the fold's score. `distributed`: each fold's model
    is the strategy's (MWM: one replica a worker) as the first fold's was."""
    scores, distributed = [], []
    for fold in range(2):
        keras.backend.clear_session()
        held_out = np.arange(SAMPLES) % 2 == fold
        model = classifier()
        distributed.append(model.distribute_strategy.num_replicas_in_sync == WORKERS)
        path = os.path.join(out, f"fold{fold}.keras")
        model.fit(x[~held_out], y[~held_out], batch_size=BATCH, epochs=2, shuffle=False, verbose=0,
                  validation_data=(x[held_out], y[held_out]),
                  callbacks=[keras.callbacks.ModelCheckpoint(path, save_best_only=True)])
        best = keras.models.load_model(path)
        scores.append(best.evaluate(x[held_out], y[held_out], batch_size=BATCH, verbose=0))
    return {"scores": numbers(scores), "weights": weights(model), "distributed": numbers(distributed),
            "files": files(out)}


@scenario
def tutorial_weights_checkpoints(out: str) -> dict:
    """TensorFlow's "Distributed training with Keras": weights checkpoints each epoch, the last one loaded back."""
    model = classifier()
    prefix = os.path.join(out, "training_checkpoints", "ckpt_{epoch}.weights.h5")
    history = model.fit(dataset(), epochs=3, verbose=0,
                        callbacks=[keras.callbacks.ModelCheckpoint(prefix, save_weights_only=True)])
    model.load_weights(prefix.format(epoch=3))
    return fitted(model, history, files=files(out))


@scenario
def several_inputs_and_outputs(out: str) -> dict:
    """A functional model: a dict of inputs, two outputs with loss_weights, sample weights."""
    keras.utils.set_random_seed(0)
    a, b = keras.Input((FEATURES,), name="a"), keras.Input((4,), name="b")
    hidden = keras.layers.Dense(8, activation="relu")(keras.layers.Concatenate()([a, b]))
    model = keras.Model({"a": a, "b": b}, {"label": keras.layers.Dense(2, name="label")(hidden),
                                           "value": keras.layers.Dense(1, name="value")(hidden)})
    model.compile("adam", loss={"label": keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                                "value": "mse"}, loss_weights={"label": 1.0, "value": 0.5})
    inputs = {"a": x, "b": x[:, :4] * 2}
    targets = {"label": y, "value": x[:, :1]}
    weight = np.linspace(0.5, 1.5, SAMPLES).astype("float32")
    history = model.fit(inputs, targets, sample_weight=weight, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
    return {"loss": numbers(history.history["loss"]),
            "evaluate": numbers(model.evaluate(inputs, targets, batch_size=BATCH, verbose=0)),
            "weights": weights(model)}


@scenario
def class_weights(out: str) -> dict:
    model = classifier()
    history = model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, class_weight={0: 1.0, 1: 3.0}, verbose=0)
    return fitted(model, history)


@scenario
def on_batch_methods(out: str) -> dict:
    """train_on_batch / test_on_batch / predict_on_batch in the script's own loop."""
    model = classifier()
    losses = [model.train_on_batch(x[i:i + BATCH], y[i:i + BATCH])[0] for i in range(0, SAMPLES, BATCH)]
    return {"loss": numbers(losses), "evaluate": numbers(model.test_on_batch(x[:BATCH], y[:BATCH])),
            "predict": numbers(np.sum(model.predict_on_batch(x[:BATCH]))), "weights": weights(model)}


class OwnTrainStep(keras.Model):
    """A custom train_step as Keras' "Customizing what happens in fit" guide writes it."""

    def train_step(self, batch):  # noqa: ANN001, ANN201
        inputs, targets = batch
        with tf.GradientTape() as tape:
            predicted = self(inputs, training=True)
            loss = self.compute_loss(x=inputs, y=targets, y_pred=predicted)
        gradients = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply_gradients(zip(gradients, self.trainable_variables))
        for metric in self.metrics:
            if metric.name == "loss":
                metric.update_state(loss)
            else:
                metric.update_state(targets, predicted)
        return {metric.name: metric.result() for metric in self.metrics}


@scenario
def custom_train_step(out: str) -> dict:
    keras.utils.set_random_seed(0)
    inputs = keras.Input((FEATURES,))
    model = OwnTrainStep(inputs, keras.layers.Dense(2)(keras.layers.Dense(8, activation="relu")(inputs)))
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    return fitted(model, model.fit(dataset(), epochs=2, verbose=0))


class OwnLossTrainStep(keras.Model):
    """The guide's "Going lower-level": its own loss object and loss tracker, compiled with an optimizer only."""

    def __init__(self, *args, **kwargs):  # noqa: ANN002, ANN003, ANN204
        super().__init__(*args, **kwargs)
        self.loss_tracker = keras.metrics.Mean(name="loss")
        self.loss_function = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def train_step(self, batch):  # noqa: ANN001, ANN201
        inputs, targets = batch
        with tf.GradientTape() as tape:
            loss = self.loss_function(targets, self(inputs, training=True))
        gradients = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply_gradients(zip(gradients, self.trainable_variables))
        self.loss_tracker.update_state(loss)
        return {"loss": self.loss_tracker.result()}

    @property
    def metrics(self):  # noqa: ANN201
        return [self.loss_tracker]


@scenario
def own_loss_train_step(out: str) -> dict:
    keras.utils.set_random_seed(0)
    inputs = keras.Input((FEATURES,))
    model = OwnLossTrainStep(inputs, keras.layers.Dense(2)(keras.layers.Dense(8, activation="relu")(inputs)))
    model.compile("adam")
    history = model.fit(dataset(), epochs=2, verbose=0, callbacks=[batch_losses := BatchLosses()])
    return {"loss": numbers(history.history["loss"]), "batch_losses": numbers(batch_losses.seen),
            "weights": weights(model)}


class BatchLosses(keras.callbacks.Callback):
    """The loss every batch's logs show (the progress bar's)."""

    def __init__(self):  # noqa: ANN204
        super().__init__()
        self.seen = []

    def on_train_batch_end(self, batch, logs=None):  # noqa: ANN001, ANN201
        self.seen.append(float(logs["loss"]))


class StopAtStep(keras.callbacks.Callback):
    """A callback that ends training mid-epoch (the same step in every process)."""

    def on_train_batch_end(self, batch, logs=None):  # noqa: ANN001, ANN201
        if batch == 3 and len(self.model.history.epoch) == 1:
            self.model.stop_training = True


@scenario
def stop_training_in_a_batch(out: str) -> dict:
    model = classifier()
    history = model.fit(dataset(), epochs=4, verbose=0, callbacks=[StopAtStep()])
    return fitted(model, history)


class TimeBudget(keras.callbacks.Callback):
    """A wall-clock budget: each process's clock decides, so processes stop at different steps (here rank 1 one
    step before rank 0, as differing clocks do)."""

    def on_train_batch_end(self, batch, logs=None):  # noqa: ANN001, ANN201
        if batch >= 4 - RANK:
            self.model.stop_training = True


@scenario
def stop_training_on_one_rank(out: str) -> dict:
    model = classifier()
    model.fit(dataset(), epochs=3, verbose=0, callbacks=[TimeBudget()])
    return {"weights": weights(model)}  # the ranks agree on one stop: compared between ranks only


@scenario
def steps_per_execution(out: str) -> dict:
    model = classifier(steps_per_execution=4)
    return fitted(model, model.fit(dataset(), epochs=2, verbose=0))


@scenario
def preprocessing_adapt(out: str) -> dict:
    keras.utils.set_random_seed(0)
    normalize = keras.layers.Normalization()
    normalize.adapt(x)
    model = keras.Sequential([keras.Input((FEATURES,)), normalize, keras.layers.Dense(2)])
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    return fitted(model, model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0))


@scenario
def timeseries_input(out: str) -> dict:
    series = np.sin(np.arange(400, dtype="float32") / 10)[:, None].repeat(FEATURES, axis=1)
    windows = keras.utils.timeseries_dataset_from_array(series[:-8], (series[8:, 0] > 0).astype("int64"),
                                                        sequence_length=1, batch_size=BATCH)
    model = classifier()
    history = model.fit(windows.map(lambda a, b: (a[:, 0], b)), epochs=2, verbose=0)
    return fitted(model, history)


def batches_of(rows: int = SAMPLES):  # noqa: ANN201
    """The global batches as a seeded, endless Python generator yields them."""
    while True:
        for start in range(0, rows, BATCH):
            yield x[start:start + BATCH], y[start:start + BATCH]


@scenario
def python_generator(out: str) -> dict:
    model = classifier()
    history = model.fit(batches_of(), steps_per_epoch=SAMPLES // BATCH, epochs=2, verbose=0)
    return fitted(model, history)


@scenario
def from_generator_dataset(out: str) -> dict:
    signature = (tf.TensorSpec((None, FEATURES), tf.float32), tf.TensorSpec((None,), tf.int64))
    finite = tf.data.Dataset.from_generator(lambda: (b for b, _ in zip(batches_of(), range(SAMPLES // BATCH))),
                                            output_signature=signature)
    model = classifier()
    return fitted(model, model.fit(finite, epochs=2, verbose=0))


class Batches(getattr(keras.utils, "PyDataset", keras.utils.Sequence)):
    """The data as Keras' PyDataset (tf_keras: its Sequence, whose workers are fit's arguments)."""

    def __len__(self) -> int:
        return SAMPLES // BATCH

    def __getitem__(self, index: int):  # noqa: ANN204
        return x[index * BATCH:(index + 1) * BATCH], y[index * BATCH:(index + 1) * BATCH]


def read_by_workers(model, processes: bool):  # noqa: ANN001, ANN201
    if hasattr(keras.utils, "PyDataset"):
        return model.fit(Batches(workers=2, use_multiprocessing=processes), epochs=2, verbose=0)
    # Unshuffled: tf_keras' OrderedEnqueuer draws the next epoch's order in its thread whenever an epoch's end outlasts
    # its 0.1 s poll, so plain python's own orders depend on timing (tests/README.md, `py_dataset_with_workers`).
    return model.fit(Batches(), epochs=2, verbose=0, workers=2, use_multiprocessing=processes, shuffle=False)


@scenario
def py_dataset_with_workers(out: str) -> dict:
    model = classifier()
    return fitted(model, read_by_workers(model, processes=False))


@scenario
def py_dataset_multiprocessing(out: str) -> dict:
    """Read by worker processes (`use_multiprocessing`), the batches still in their order."""
    model = classifier()
    return fitted(model, read_by_workers(model, processes=True))


def written_once(folder: str, write) -> str:  # noqa: ANN001
    """A data folder the chief writes (atomically) and every rank waits for, as a job's data already on disk."""
    if RANK == 0 and not os.path.isdir(folder):
        write(folder + ".tmp")
        os.replace(folder + ".tmp", folder)
    deadline = time.monotonic() + 60
    while not os.path.isdir(folder) and time.monotonic() < deadline:
        time.sleep(0.1)
    return folder


def write_images(folder: str) -> None:
    pixels = np.random.default_rng(3).integers(0, 255, size=(48, 8, 8, 3))
    for index, image in enumerate(pixels):
        os.makedirs(os.path.join(folder, str(index % 2)), exist_ok=True)
        keras.utils.save_img(os.path.join(folder, str(index % 2), f"{index}.png"), image)


@scenario
def image_directory(out: str) -> dict:
    """image_dataset_from_directory over a seeded shuffle, as Keras' image classification guide reads its data."""
    images = written_once(os.path.join(OUT, "images"), write_images)
    data = keras.utils.image_dataset_from_directory(images, image_size=(8, 8), batch_size=8, shuffle=True, seed=3)
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8, 8, 3)), keras.layers.Rescaling(1 / 255), keras.layers.Flatten(),
                              keras.layers.Dense(2)])
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    history = model.fit(data, epochs=2, verbose=0)
    return {"loss": numbers(history.history["loss"]), "weights": weights(model)}


@scenario
def numpy_shuffled(out: str) -> dict:
    """fit(shuffle=True), Keras' default, after the script's own seed; every batch's logs (the progress bar's)."""
    model = classifier()
    history = model.fit(x, y, batch_size=BATCH, epochs=2, verbose=0, callbacks=[batch_losses := BatchLosses()])
    return fitted(model, history, batch_losses=numbers(batch_losses.seen))


@scenario
def ema(out: str) -> dict:
    """The optimizer's moving average of the weights (use_ema), swapped in for validation by SwapEMAWeights where
    the Keras has it."""
    model = classifier(keras.optimizers.Adam(use_ema=True, ema_momentum=0.9))
    swap = [keras.callbacks.SwapEMAWeights(swap_on_epoch=True)] if hasattr(keras.callbacks, "SwapEMAWeights") else []
    history = model.fit(dataset(), epochs=2, verbose=0, validation_data=dataset(), callbacks=swap)
    return fitted(model, history, val_loss=numbers(history.history["val_loss"]), swapped=len(swap))


@scenario
def gradient_accumulation(out: str) -> dict:
    """The optimizer's gradient_accumulation_steps, where the Keras has it (Keras 3)."""
    accumulates = "gradient_accumulation_steps" in inspect.signature(keras.optimizers.Adam).parameters
    model = classifier(keras.optimizers.Adam(**({"gradient_accumulation_steps": 2} if accumulates else {})))
    return fitted(model, model.fit(dataset(), epochs=2, verbose=0), accumulates=int(accumulates))


class EvaluateWithinEpochs(keras.callbacks.Callback):
    """Evaluates the model at every epoch's second step, as a script watching its validation data in long epochs:
    Keras does not reset the metric states after it, so the epoch's logs count that evaluation once too. Keeps each
    step's logs of the ratio metrics (what a progress bar shows)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen, self.steps = [], []

    def on_train_batch_end(self, batch, logs=None):  # noqa: ANN001
        self.steps += [float(logs["precision"]), float(logs["auc"])]
        if batch == 1:
            self.seen.append(self.model.evaluate(x_val, y_val, batch_size=BATCH, verbose=0, return_dict=True)["auc"])


@scenario
def ratio_metrics(out: str) -> dict:
    """Metrics that are not means of the batches (Precision, Recall, AUC), on the training and validation data:
    fit's logs of them, as Keras computes them from the global counts; again with an evaluate within each epoch."""
    results = {}
    for within in ("", "within_"):
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(8, activation="relu"),
                                  keras.layers.Dense(1, activation="sigmoid")])
        model.compile("adam", "binary_crossentropy",
                      metrics=[keras.metrics.Precision(name="precision"), keras.metrics.Recall(name="recall"),
                               keras.metrics.AUC(name="auc")])
        callbacks = [EvaluateWithinEpochs()] if within else []
        history = model.fit(dataset(), epochs=2, verbose=0, validation_data=dataset().take(2), callbacks=callbacks)
        results.update({within + key: value for key, value in fitted(model, history).items()})
        results.update({within + key: numbers(history.history[key])
                        for key in ("precision", "recall", "auc", "val_precision", "val_auc")})
        if callbacks:
            results.update({within + "evaluated": numbers(callbacks[0].seen), "steps": numbers(callbacks[0].steps)})
    return results


@scenario
def synchronized_batchnorm(out: str) -> dict:
    """BatchNormalization(synchronized=True), as TensorFlow's guides advise for several replicas: the global batch's
    statistics, so one process's numbers in every mode (an unsynchronized layer normalizes each replica's share)."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(8),
                              keras.layers.BatchNormalization(synchronized=True), keras.layers.Activation("relu"),
                              keras.layers.Dense(2)])
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    return fitted(model, model.fit(dataset(), epochs=2, verbose=0))


@scenario
def own_backup_and_h5(out: str) -> dict:
    """The script's own BackupAndRestore, validation every second epoch, the model saved as .h5 and by
    keras.saving.save_model, the .h5 loaded back."""
    model = classifier()
    history = model.fit(x, y, batch_size=BATCH, epochs=4, shuffle=False, validation_data=(x_val, y_val),
                        validation_freq=2, verbose=0,
                        callbacks=[keras.callbacks.BackupAndRestore(os.path.join(out, "backup"))])
    model.save(os.path.join(out, "model.h5"))
    keras.saving.save_model(model, os.path.join(out, "saved.keras"))
    loaded = keras.models.load_model(os.path.join(out, "model.h5"))
    return fitted(model, history, val_loss=numbers(history.history["val_loss"]),
                  reloaded=numbers(loaded.evaluate(x, y, batch_size=BATCH, verbose=0)), files=files(out))


@scenario
def own_backup_over_tf_data(out: str) -> dict:
    """The script's own BackupAndRestore (distrain's checkpoints then stand aside) over a tf.data dataset, Adam."""
    model = classifier()
    backup = keras.callbacks.BackupAndRestore(os.path.join(out, "backup"))
    return fitted(model, model.fit(dataset(), epochs=3, verbose=0, callbacks=[backup]))


@scenario
def pandas_frame(out: str) -> dict:
    """A pandas DataFrame and Series given to fit (a validation split, Keras' shuffle), evaluate and predict."""
    import pandas as pd

    frame, labels = pd.DataFrame(x, columns=[f"f{i}" for i in range(FEATURES)]), pd.Series(y, name="label")
    model = classifier()
    history = model.fit(frame, labels, batch_size=BATCH, epochs=2, validation_split=0.25, verbose=0)
    return {"loss": numbers(history.history["loss"]), "val_loss": numbers(history.history["val_loss"]),
            "evaluate": numbers(model.evaluate(frame, labels, batch_size=BATCH, verbose=0)),
            "predict": numbers(np.sum(model.predict(frame, batch_size=BATCH, verbose=0))), "weights": weights(model)}


@scenario
def own_one_device_strategy(out: str) -> dict:
    """TensorFlow's "Save and load a model using a distribution strategy": a model saved, then loaded and trained
    on inside the script's own OneDeviceStrategy scope. Last: where it fails under MWM (Keras 3.3), its collectives
    abort every one after it."""
    model = classifier()
    model.fit(dataset(), epochs=1, verbose=0)
    model.save(os.path.join(out, "saved.keras"))
    with tf.distribute.OneDeviceStrategy("/cpu:0").scope():
        again = keras.models.load_model(os.path.join(out, "saved.keras"))
        history = again.fit(dataset(), epochs=1, verbose=0)
    return fitted(again, history, files=files(out))


def write_texts(folder: str) -> None:
    words = np.random.default_rng(5)
    for index in range(48):
        os.makedirs(os.path.join(folder, str(index % 2)), exist_ok=True)
        with open(os.path.join(folder, str(index % 2), f"{index}.txt"), "w") as handle:
            handle.write(" ".join(f"w{n}" for n in words.integers(0, 30 if index % 2 else 20, size=8)))


@scenario
def text_directory(out: str) -> dict:
    """text_dataset_from_directory and a TextVectorization adapted on it, as Keras' text classification guide."""
    keras.utils.set_random_seed(0)  # the shuffle's seeds are (global, 5): the global one is this scenario's own
    texts = written_once(os.path.join(OUT, "texts"), write_texts)
    data = keras.utils.text_dataset_from_directory(texts, batch_size=8, shuffle=True, seed=5)
    vectorize = keras.layers.TextVectorization(max_tokens=40, output_sequence_length=8)
    vectorize.adapt(data.map(lambda text, label: text))
    model = keras.Sequential([keras.Input((8,), dtype="int64"), keras.layers.Embedding(40, 4),
                              keras.layers.GlobalAveragePooling1D(), keras.layers.Dense(2)])
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    history = model.fit(data.map(lambda text, label: (vectorize(text), label)), epochs=2, verbose=0)
    return {"loss": numbers(history.history["loss"]), "weights": weights(model)}


@scenario
def mixed_precision(out: str) -> dict:
    """The mixed_float16 policy (Keras' mixed precision guide): float16 compute, float32 variables, loss scaling."""
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = classifier()
        return fitted(model, model.fit(dataset(), epochs=2, verbose=0))
    finally:
        keras.mixed_precision.set_global_policy("float32")


@scenario
def tf_train_checkpoint(out: str) -> dict:
    """tf.train.Checkpoint and CheckpointManager after every epoch, the latest restored (TensorFlow's guides)."""
    model = classifier()
    checkpoint = tf.train.Checkpoint(model=model, optimizer=model.optimizer)
    manager = tf.train.CheckpointManager(checkpoint, os.path.join(out, "checkpoints"), max_to_keep=2)
    saves = keras.callbacks.LambdaCallback(on_epoch_end=lambda epoch, logs: manager.save())
    history = model.fit(dataset(), epochs=3, verbose=0, callbacks=[saves])
    checkpoint.restore(manager.latest_checkpoint)
    return fitted(model, history, files=files(out))


@scenario
def export_saved_model(out: str) -> dict:
    """model.export (a SavedModel for serving), read back with tf.saved_model.load and served."""
    model = classifier()
    history = model.fit(dataset(), epochs=1, verbose=0)
    model.export(os.path.join(out, "exported"))
    served = tf.saved_model.load(os.path.join(out, "exported"))
    return fitted(model, history, served=numbers(np.sum(served.serve(x[:64]))), files=files(out))


class TwoOptimizers(keras.Model):
    """The GAN of Keras' "Customizing what happens in fit" guide: a discriminator and a generator, each updated by
    an optimizer of the model's own `compile` (the "noise" a function of the batch, so that every mode draws the
    same)."""

    def __init__(self) -> None:
        super().__init__()
        self.discriminator = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(8, activation="relu"),
                                               keras.layers.Dense(1)])
        self.generator = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(FEATURES)])
        self.d_loss_tracker, self.g_loss_tracker = keras.metrics.Mean(name="d_loss"), keras.metrics.Mean(name="g_loss")

    def compile(self, d_optimizer, g_optimizer, loss_fn):  # noqa: ANN001, ANN201, A003
        super().compile()
        self.d_optimizer, self.g_optimizer, self.loss_fn = d_optimizer, g_optimizer, loss_fn

    @property
    def metrics(self):  # noqa: ANN201
        return [self.d_loss_tracker, self.g_loss_tracker]

    def train_step(self, real):  # noqa: ANN001, ANN201
        if isinstance(real, tuple):
            real = real[0]
        noise = tf.reverse(real, axis=[1]) * 0.5
        ones, zeros = tf.ones_like(real[:, :1]), tf.zeros_like(real[:, :1])
        with tf.GradientTape() as tape:
            predictions = self.discriminator(tf.concat([self.generator(noise), real], axis=0))
            d_loss = self.loss_fn(tf.concat([ones, zeros], axis=0), predictions)
        grads = tape.gradient(d_loss, self.discriminator.trainable_weights)
        self.d_optimizer.apply_gradients(zip(grads, self.discriminator.trainable_weights))
        with tf.GradientTape() as tape:
            g_loss = self.loss_fn(zeros, self.discriminator(self.generator(noise)))
        grads = tape.gradient(g_loss, self.generator.trainable_weights)
        self.g_optimizer.apply_gradients(zip(grads, self.generator.trainable_weights))
        self.d_loss_tracker.update_state(d_loss)
        self.g_loss_tracker.update_state(g_loss)
        return {"d_loss": self.d_loss_tracker.result(), "g_loss": self.g_loss_tracker.result()}


@scenario
def own_optimizers_in_train_step(out: str) -> dict:
    """A train_step updating with two optimizers of the model's own compile (the keras-io GAN)."""
    keras.utils.set_random_seed(0)
    model = TwoOptimizers()
    model.compile(keras.optimizers.Adam(0.003), keras.optimizers.Adam(0.003),
                  keras.losses.BinaryCrossentropy(from_logits=True))
    history = model.fit(tf.data.Dataset.from_tensor_slices(x).batch(BATCH), epochs=2, verbose=0)
    return {"d_loss": numbers(history.history["d_loss"]), "g_loss": numbers(history.history["g_loss"]),
            "weights": weights(model.discriminator) + "," + weights(model.generator)}


@scenario
def saved_model_on_localhost(out: str) -> dict:
    """TensorFlow's save-and-load tutorial: a SavedModel and a checkpoint written and read back with
    experimental_io_device="/job:localhost" (this host)."""
    model = classifier()
    history = model.fit(dataset(), epochs=1, verbose=0)
    local, path = "/job:localhost", os.path.join(out, "saved")
    tf.saved_model.save(model, path, options=tf.saved_model.SaveOptions(experimental_io_device=local))
    loaded = tf.saved_model.load(path, options=tf.saved_model.LoadOptions(experimental_io_device=local))
    served = list(loaded.signatures["serving_default"](tf.constant(x[:64])).values())[0]
    checkpoint = tf.train.Checkpoint(model=model)
    options = tf.train.CheckpointOptions(experimental_io_device=local)
    checkpoint.restore(checkpoint.save(os.path.join(out, "checkpoints", "ckpt"), options=options), options=options)
    return fitted(model, history, served=numbers(np.sum(served)), files=files(out))


@scenario
def jit_compile(out: str) -> dict:
    """compile(jit_compile=True): XLA, where the Keras version can compile the step around the ranks' all-reduce;
    else refused with one line (distrain's EnvironmentProblem, caught here as the scenario's status)."""
    model = classifier(jit_compile=True)
    return fitted(model, model.fit(dataset(), epochs=2, verbose=0))


def run(names: list[str]) -> None:
    for name in names:
        out = os.path.join(OUT, name)
        os.makedirs(out, exist_ok=True)
        done = threading.Event()

        def deadline(name: str = name, done: threading.Event = done) -> None:
            if not done.wait(DEADLINE_SECONDS):
                print(f"CONFORM name={name} status=timeout", flush=True)
                with open(os.path.join(OUT, f"{name}-rank{RANK}-stacks.txt"), "w") as stacks:  # where it waited
                    faulthandler.dump_traceback(stacks, all_threads=True)
                for child in multiprocessing.active_children():  # a pool's workers would keep the output open
                    child.kill()
                os._exit(3)

        threading.Thread(target=deadline, daemon=True).start()
        started = time.monotonic()
        try:
            result = {"status": "ok", **SCENARIOS[name](out)}
        except Exception as exc:  # noqa: BLE001 - each scenario its own verdict
            if os.environ.get("CONFORM_TRACEBACK"):
                traceback.print_exc()
            result = {"status": f"error:{type(exc).__name__}:{str(exc).splitlines()[0] if str(exc) else ''}"}
        done.set()
        result["seconds"] = f"{time.monotonic() - started:.1f}"
        print(f"CONFORM name={name} " + " ".join(f"{k}={str(v).replace(' ', '_')}" for k, v in result.items()),
              flush=True)


if __name__ == "__main__":
    chosen = [a for a in sys.argv[2:] if a in SCENARIOS]
    run(chosen or list(SCENARIOS))
