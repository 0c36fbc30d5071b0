"""Horovod's tensorflow2_synthetic_benchmark.py, as users copy it: `from tensorflow.keras import applications`, a
custom loop with hvd.DistributedGradientTape, the model's and the optimizer's variables broadcast after the first
step (`opt.variables()`), images/sec per device from rank 0; plus the rank-0 `model.save` users add. The model
has BatchNormalization and each rank draws its own random images, so its moving statistics differ per rank unless
they are averaged. (MobileNet at 32x32, width 0.25, for the CPU: its trace is a quarter of
MobileNetV2's, and the benchmark takes any `applications` model by name.)"""
import hashlib
import os
import sys
import tempfile
import timeit

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf
from tensorflow.keras import applications

hvd.init()
gpus = tf.config.experimental.list_physical_devices("GPU")
for gpu in gpus:
    tf.config.experimental.set_memory_growth(gpu, True)
if gpus:
    tf.config.experimental.set_visible_devices(gpus[hvd.local_rank()], "GPU")

batch_size, num_warmup_batches, num_batches_per_iter, num_iters = 8, 2, 4, 6
model = applications.MobileNet(weights=None, input_shape=(32, 32, 3), classes=10, alpha=0.25)
opt = tf.optimizers.SGD(0.01)
data = tf.random.uniform([batch_size, 32, 32, 3])
target = tf.random.uniform([batch_size, 1], minval=0, maxval=9, dtype=tf.int64)
losses = []


@tf.function
def benchmark_step(first_batch):
    with tf.GradientTape() as tape:
        probs = model(data, training=True)
        loss = tf.losses.sparse_categorical_crossentropy(target, probs)
    tape = hvd.DistributedGradientTape(tape, compression=hvd.Compression.none)
    gradients = tape.gradient(loss, model.trainable_variables)
    opt.apply_gradients(zip(gradients, model.trainable_variables))
    if first_batch:
        hvd.broadcast_variables(model.variables, root_rank=0)
        hvd.broadcast_variables(opt.variables(), root_rank=0)
    return tf.reduce_mean(loss)


losses.append(float(benchmark_step(first_batch=True)))
for _ in range(num_warmup_batches):
    benchmark_step(first_batch=False)
img_secs = []
for x in range(num_iters):
    time = timeit.timeit(lambda: losses.append(float(benchmark_step(first_batch=False))), number=num_batches_per_iter)
    img_sec = batch_size * num_batches_per_iter / time
    if hvd.rank() == 0:
        print(f"Iter #{x}: {img_sec:.1f} img/sec per CPU/GPU")
    img_secs.append(img_sec)
if hvd.rank() == 0:
    print(f"Img/sec per CPU/GPU: {np.mean(img_secs):.1f}")
    model.save(sys.argv[1] if len(sys.argv) > 1 else os.path.join(tempfile.mkdtemp(), "model.keras"))
digest = hashlib.sha256(b"".join(np.ascontiguousarray(w).tobytes() for w in model.get_weights())).hexdigest()[:16]
print(f"RESULT loss_first={losses[0]:.4f} loss_last={np.mean(losses[-4:]):.4f} weights={digest}", flush=True)
