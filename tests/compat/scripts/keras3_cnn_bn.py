"""Keras 3 CNN in the style of the Keras examples, with no input shape (built on its first batch):
BatchNormalization and Dropout, numpy input whose last batch holds a single sample (769 = 12 x 64 + 1),
validation_data as arrays, ModelCheckpoint to .keras, EarlyStopping, CSVLogger; evaluate and predict after fit."""
import hashlib
import os
import sys
import tempfile

import counting
import keras
import numpy as np
from keras import layers

keras.utils.set_random_seed(7)
rng = np.random.default_rng(7)
x = rng.random((897, 10, 10, 1)).astype("float32")
y = (x[:, :5].mean(axis=(1, 2, 3)) > x[:, 5:].mean(axis=(1, 2, 3))).astype("int64")
model = keras.Sequential([
    counting.layer(keras),
    layers.Conv2D(8, 3, activation="relu"),
    layers.BatchNormalization(),
    layers.Dropout(0.2),
    layers.GlobalAveragePooling2D(),
    layers.Dense(2, activation="softmax"),
])
model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
logs = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp()
callbacks = [keras.callbacks.ModelCheckpoint(os.path.join(logs, "best.keras"), save_best_only=True),
             keras.callbacks.EarlyStopping(monitor="val_loss", patience=5, restore_best_weights=True),
             keras.callbacks.CSVLogger(os.path.join(logs, "history.csv"))]
history = model.fit(x[:769], y[:769], batch_size=64, epochs=3, validation_data=(x[769:], y[769:]),
                    callbacks=callbacks)
evaluation = model.evaluate(x[769:], y[769:], verbose=0)
predictions = model.predict(x[:3], verbose=0)
losses = history.history["loss"]
digest = hashlib.sha256(b"".join(np.ascontiguousarray(w).tobytes() for w in model.get_weights())).hexdigest()[:16]
print(f"RESULT loss_first={losses[0]:.4f} loss_last={losses[-1]:.4f} predict={predictions.shape[0]} "
      f"weights={digest} samples={counting.trained()} total={769 * len(losses)}", flush=True)
