"""Horovod's tensorflow2_keras_synthetic_benchmark.py, as users copy it: a tf.keras.applications model on
synthetic images, hvd.DistributedOptimizer, compile(experimental_run_tf_function=False), the broadcast callback,
fit(steps_per_epoch) timed by a callback, images/sec per device from rank 0. (MobileNet at 32x32, width 0.25, for
the CPU: its trace is a quarter of MobileNetV2's, and the benchmark takes any `applications` model by name.)"""
import hashlib
import timeit

import horovod.tensorflow.keras as hvd
import numpy as np
import tensorflow as tf
from tensorflow.keras import applications

hvd.init()
gpus = tf.config.experimental.list_physical_devices("GPU")
for gpu in gpus:
    tf.config.experimental.set_memory_growth(gpu, True)
if gpus:
    tf.config.experimental.set_visible_devices(gpus[hvd.local_rank()], "GPU")

batch_size, num_batches_per_iter, num_iters = 8, 4, 3
model = applications.MobileNet(weights=None, input_shape=(32, 32, 3), classes=10, alpha=0.25)
opt = tf.optimizers.SGD(0.01)
opt = hvd.DistributedOptimizer(opt, compression=hvd.Compression.none)
model.compile(loss=tf.losses.SparseCategoricalCrossentropy(), optimizer=opt, experimental_run_tf_function=False)

data = tf.random.uniform([batch_size, 32, 32, 3])
target = tf.random.uniform([batch_size, 1], minval=0, maxval=9, dtype=tf.int64)
dataset = tf.data.Dataset.from_tensor_slices((data, target)).cache().repeat().batch(batch_size)
callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0)]


class TimingCallback(tf.keras.callbacks.Callback):
    def on_train_begin(self, logs=None):
        self.img_secs = []

    def on_epoch_begin(self, epoch, logs=None):
        self.starttime = timeit.default_timer()

    def on_epoch_end(self, epoch, logs=None):
        time = timeit.default_timer() - self.starttime
        img_sec = batch_size * num_batches_per_iter / time
        if hvd.rank() == 0:
            print(f"Iter #{epoch}: {img_sec:.1f} img/sec per CPU/GPU")
        if epoch > 0:
            self.img_secs.append(img_sec)


timing = TimingCallback()
callbacks.append(timing)
history = model.fit(dataset, steps_per_epoch=num_batches_per_iter, callbacks=callbacks, epochs=num_iters + 1,
                    verbose=0)
if hvd.rank() == 0:
    print(f"Img/sec per CPU/GPU: {np.mean(timing.img_secs):.1f}")
losses = history.history["loss"]
digest = hashlib.sha256(b"".join(np.ascontiguousarray(w).tobytes() for w in model.get_weights())).hexdigest()[:16]
print(f"RESULT loss_first={losses[0]:.4f} loss_last={losses[-1]:.4f} weights={digest}", flush=True)
