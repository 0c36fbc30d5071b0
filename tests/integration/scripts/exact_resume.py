"""A plain Keras script with numpy input, shuffled every epoch, that records which samples it trains on.

    distrain run exact_resume.py --out DIR [--epochs 3]

Test instruments, not part of the pattern: the model's first layer appends the index of every sample it trains
on to DIR/ids-rank<r>.txt (one line per batch), the chief writes its final weights to DIR/weights.npy (with
--batch-norm, the moving statistics apart to DIR/statistics.npy), and
STOP_AT=EPOCH:STEP makes rank 0 send itself SIGTERM after that step (1-based; with several steps a call, after the
call that ran it), as a preemption would;
CRASH_AT=EPOCH:STEP makes it die there at once (os._exit), as a crash or a lost node would: no checkpoint then;
KILL_AT=EPOCH:STEP makes rank KILL_RANK (1) SIGKILL itself there, as the OOM killer would: once (DIR/killed marks
it), or in every attempt with KILL_EVERY_TIME=1.
"""

import argparse
import json
import os
import signal

import numpy as np
import tensorflow as tf

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--samples", type=int, default=100)
parser.add_argument("--batch-size", type=int, default=16)
parser.add_argument("--steps-per-execution", type=int, default=1)
parser.add_argument("--input", choices=["numpy", "tfdata", "stream", "tfrecord", "pydataset", "generator",
                                        "from-generator"], default="numpy",
                    help="numpy arrays with shuffle=True, a tf.data dataset with a seeded per-epoch reshuffle, "
                         "an endless one (shuffle(seed).repeat().batch) with fit's steps_per_epoch, TFRecord "
                         "shards through TensorFlow's performance guide's pipeline (its length unknown), a PyDataset "
                         "(tf_keras: Sequence) reshuffled by its on_epoch_end with a seed, fit's shuffle=False; an "
                         "endless Python generator with steps_per_epoch, given as it is or through "
                         "tf.data.Dataset.from_generator")
parser.add_argument("--unseeded", action="store_true",
                    help="the PyDataset and generator reshuffle without a seed: another order in every process")
parser.add_argument("--batch-norm", action="store_true",
                    help="a BatchNormalization layer; its moving statistics go to DIR/statistics.npy, apart")
parser.add_argument("--no-input-shape", action="store_true", help="a Sequential built on its first batch")
parser.add_argument("--reduce-lr-on-plateau", action="store_true",
                    help="ReduceLROnPlateau(monitor='loss', patience=0): the learning rate halves at the end of "
                         "every epoch from the second on (its min_delta of 10 counts no epoch as an improvement)")
parser.add_argument("--early-stopping", action="store_true",
                    help="EarlyStopping(monitor='loss', patience=2, restore_best_weights=True): its min_delta of 10 "
                         "counts only the first epoch as an improvement, so the third's end restores the first's "
                         "weights; and a batch hook of the script's own recording every call")
parser.add_argument("--wide", type=int, default=0,
                    help="a hidden Dense layer of this many units after the first (370000: about 44 MB of weights and "
                         "Adam's state, a checkpoint whose write takes long enough to be killed in)")
parser.add_argument("--own-backup", action="store_true",
                    help="the script's own BackupAndRestore into DIR/backup (the Keras guides' fault tolerance)")
args = parser.parse_args()

tf.keras.utils.set_random_seed(1)
rng = np.random.default_rng(0)
features = rng.normal(size=(args.samples, 4)).astype("float32")
x = np.concatenate([features, np.arange(args.samples, dtype="float32")[:, None]], axis=1)  # last column: index
y = (features.sum(axis=1) > 0).astype("float32")


def my_rank() -> int:
    if os.environ.get("TF_CONFIG"):
        return json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    for name in ("HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID"):  # horovodrun, mpirun, srun
        if os.environ.get(name):
            return int(os.environ[name])
    return 0


def record(indices):
    with open(os.path.join(args.out, f"ids-rank{my_rank()}.txt"), "a") as handle:
        handle.write(" ".join(str(int(i)) for i in indices) + "\n")
    return np.int64(len(indices))


def write_shards(count: int) -> list[str]:
    """x and y as `count` TFRecord files of tf.train.Examples, in this rank's own directory under --out."""
    directory = os.path.join(args.out, f"records-rank{my_rank()}")
    os.makedirs(directory, exist_ok=True)
    paths = [os.path.join(directory, f"part-{i}.tfrecord") for i in range(count)]
    for i, path in enumerate(paths):
        with tf.io.TFRecordWriter(path) as writer:
            for row in range(i, args.samples, count):
                features = {"x": tf.train.Feature(float_list=tf.train.FloatList(value=x[row])),
                            "y": tf.train.Feature(float_list=tf.train.FloatList(value=[y[row]]))}
                writer.write(tf.train.Example(features=tf.train.Features(feature=features)).SerializeToString())
    return paths


def parse(record):
    parsed = tf.io.parse_single_example(record, {"x": tf.io.FixedLenFeature([5], tf.float32),
                                                 "y": tf.io.FixedLenFeature([], tf.float32)})
    return parsed["x"], parsed["y"]


class RecordIds(tf.keras.layers.Layer):
    def call(self, inputs, training=None):
        if training:
            done = tf.numpy_function(record, [inputs[:, -1]], tf.int64, stateful=True)
            with tf.control_dependencies([done]):
                return tf.identity(inputs[:, :-1])
        return inputs[:, :-1]

    def compute_output_shape(self, input_shape):
        return (input_shape[0], input_shape[1] - 1)


class StopAt(tf.keras.callbacks.Callback):
    def __init__(self, epoch: int, step: int, crash: bool = False, kill: bool = False):
        super().__init__()
        self.stop_at, self.epoch, self.crash, self.kill, self.done = (epoch - 1, step - 1), 0, crash, kill, False
        self.rank = int(os.environ.get("KILL_RANK", "1")) if kill else 0
        self.marker = os.path.join(args.out, "killed")
        self.done = kill and os.path.exists(self.marker) and os.environ.get("KILL_EVERY_TIME") != "1"

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):  # a call's first batch or its last, as the Keras version says
        if (self.epoch, batch) >= self.stop_at and not self.done and my_rank() == self.rank:
            self.done = True
            if self.kill:
                open(self.marker, "a").close()
                os.kill(os.getpid(), signal.SIGKILL)
            if self.crash:
                os._exit(1)
            os.kill(os.getpid(), signal.SIGTERM)


class RecordBatchEnds(tf.keras.callbacks.Callback):
    """The script's own batch hook: every call appends its epoch and batch to DIR/batch-ends-rank<r>.txt."""

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        with open(os.path.join(args.out, f"batch-ends-rank{my_rank()}.txt"), "a") as handle:
            handle.write(f"{self.epoch}:{batch}\n")


normalize = [tf.keras.layers.BatchNormalization()] if args.batch_norm else []
shape = [] if args.no_input_shape else [tf.keras.layers.Input((5,))]
wide = [tf.keras.layers.Dense(args.wide, activation="relu")] if args.wide else []
model = tf.keras.Sequential([*shape, RecordIds(), tf.keras.layers.Dense(8, activation="relu"), *normalize, *wide,
                             tf.keras.layers.Dense(1)])
model.compile(optimizer=tf.keras.optimizers.Adam(0.01), loss=tf.keras.losses.BinaryCrossentropy(from_logits=True),
              steps_per_execution=args.steps_per_execution)
stop_at = os.environ.get("STOP_AT") or os.environ.get("CRASH_AT") or os.environ.get("KILL_AT")
callbacks = [StopAt(*map(int, stop_at.split(":")), crash="CRASH_AT" in os.environ,
                    kill="KILL_AT" in os.environ)] if stop_at else []
if args.reduce_lr_on_plateau:
    callbacks.append(tf.keras.callbacks.ReduceLROnPlateau(monitor="loss", factor=0.5, patience=0, min_delta=10.0))
if args.early_stopping:
    callbacks.append(tf.keras.callbacks.EarlyStopping(monitor="loss", min_delta=10.0, patience=2,
                                                      restore_best_weights=True))
    callbacks.append(RecordBatchEnds())
if args.own_backup:
    callbacks.append(tf.keras.callbacks.BackupAndRestore(os.path.join(args.out, "backup")))
if args.input == "numpy":
    history = model.fit(x, y, batch_size=args.batch_size, epochs=args.epochs, shuffle=True, callbacks=callbacks)
elif args.input == "tfdata":
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(args.samples, seed=7).batch(args.batch_size)
    history = model.fit(dataset, epochs=args.epochs, callbacks=callbacks)
elif args.input == "tfrecord":  # the tf.data performance guide's pipeline over TFRecord shards
    dataset = (tf.data.Dataset.from_tensor_slices(write_shards(4)).interleave(
        tf.data.TFRecordDataset, cycle_length=2, num_parallel_calls=tf.data.AUTOTUNE)
        .map(parse, num_parallel_calls=tf.data.AUTOTUNE).cache().shuffle(args.samples, seed=7)
        .batch(args.batch_size).prefetch(tf.data.AUTOTUNE))  # of unknown length: Keras' epochs end where it ends
    history = model.fit(dataset, epochs=args.epochs, callbacks=callbacks)
elif args.input == "pydataset":  # Keras' PyDataset guide: batches by index, reshuffled at each epoch's end
    base = getattr(tf.keras.utils, "PyDataset", None) or tf.keras.utils.Sequence

    class Batches(base):
        def __init__(self):
            super().__init__()
            self.order, self.rng = np.arange(args.samples), np.random.default_rng(None if args.unseeded else 5)

        def __len__(self):
            return -(-args.samples // args.batch_size)

        def __getitem__(self, index):
            chosen = self.order[index * args.batch_size:(index + 1) * args.batch_size]
            return x[chosen], y[chosen]

        def on_epoch_end(self):
            self.rng.shuffle(self.order)

    history = model.fit(Batches(), epochs=args.epochs, shuffle=False, callbacks=callbacks)
elif args.input in ("generator", "from-generator"):  # an endless generator of full batches, reshuffled each pass

    def batches_forever():
        rng = np.random.default_rng(None if args.unseeded else 5)
        while True:
            order = rng.permutation(args.samples)
            for start in range(0, args.samples - args.batch_size + 1, args.batch_size):
                yield x[order[start:start + args.batch_size]], y[order[start:start + args.batch_size]]

    data = batches_forever() if args.input == "generator" else tf.data.Dataset.from_generator(
        batches_forever, output_signature=(tf.TensorSpec((None, 5), tf.float32), tf.TensorSpec((None,), tf.float32)))
    history = model.fit(data, epochs=args.epochs, steps_per_epoch=args.samples // args.batch_size,
                        callbacks=callbacks)
else:  # Horovod's and TensorFlow's examples: an endless stream, epochs of steps_per_epoch batches (batches
    # straddle the passes over the samples)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(args.samples, seed=7).repeat().batch(args.batch_size)
    history = model.fit(dataset, epochs=args.epochs, steps_per_epoch=args.samples // args.batch_size,
                        callbacks=callbacks)
with open(os.path.join(args.out, f"history-rank{my_rank()}.json"), "w") as handle:  # what fit returned
    json.dump({"epoch": history.epoch, "history": {k: [float(v) for v in vs] for k, vs in history.history.items()}},
              handle)
if args.batch_norm:  # the weights, and apart the moving statistics: read on every rank (under MWM tf_keras
    # reading them is a collective), written by the chief
    weights = np.concatenate([w.numpy().ravel() for w in model.trainable_weights])
    statistics = np.concatenate([w.numpy().ravel() for w in model.non_trainable_weights])
    if my_rank() == 0:
        np.save(os.path.join(args.out, "weights.npy"), weights)
        np.save(os.path.join(args.out, "statistics.npy"), statistics)
elif my_rank() == 0:
    np.save(os.path.join(args.out, "weights.npy"), np.concatenate([w.ravel() for w in model.get_weights()]))
