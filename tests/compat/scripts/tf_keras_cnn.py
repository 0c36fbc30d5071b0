"""A tf_keras CNN with no input shape (built on its first batch), BatchNormalization and Dropout, and the usual
callbacks: ModelCheckpoint, EarlyStopping, TensorBoard; evaluate and predict after fit."""
import hashlib
import os
import sys
import tempfile

os.environ["TF_USE_LEGACY_KERAS"] = "1"
import counting  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

tf.keras.utils.set_random_seed(4)
rng = np.random.default_rng(4)
x = rng.random((640, 12, 12, 1)).astype("float32")
y = (x[:, :6].mean(axis=(1, 2, 3)) > x[:, 6:].mean(axis=(1, 2, 3))).astype("int64")
model = tf.keras.Sequential([
    counting.layer(tf.keras),
    tf.keras.layers.Conv2D(8, 3, activation="relu"),
    tf.keras.layers.BatchNormalization(),
    tf.keras.layers.Dropout(0.25),
    tf.keras.layers.Flatten(),
    tf.keras.layers.Dense(2),
])
model.compile(optimizer="adam", loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
              metrics=["accuracy"])
logs = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp()
callbacks = [tf.keras.callbacks.ModelCheckpoint(os.path.join(logs, "best.keras"), save_best_only=True,
                                                monitor="val_loss"),
             tf.keras.callbacks.EarlyStopping(monitor="val_loss", patience=5),
             tf.keras.callbacks.TensorBoard(os.path.join(logs, "tb"))]
history = model.fit(x, y, batch_size=32, epochs=3, validation_split=0.2, callbacks=callbacks)
evaluation = model.evaluate(x, y, verbose=0)
predictions = model.predict(x[:5], verbose=0)
losses = history.history["loss"]
digest = hashlib.sha256(b"".join(np.ascontiguousarray(w).tobytes() for w in model.get_weights())).hexdigest()[:16]
print(f"RESULT family={type(model).__module__.split('.')[0]} loss_first={losses[0]:.4f} "
      f"loss_last={losses[-1]:.4f} predict={predictions.shape[0]} weights={digest} "
      f"samples={counting.trained()} total={512 * len(losses)}", flush=True)
