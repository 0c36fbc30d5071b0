"""A script as keras-io's examples write it: fit, evaluate and predict with Keras' default progress bars (no
`verbose`), a ModelCheckpoint whose saves distrain reports while a bar is mid-line."""
import sys

import numpy as np

if "--keras" in sys.argv and sys.argv[sys.argv.index("--keras") + 1] == "legacy":
    import tf_keras as keras
else:
    import keras

keras.utils.set_random_seed(1)
x = np.random.default_rng(1).normal(size=(320, 6)).astype("float32")
y = (x.sum(axis=1) > 0).astype("int64")
model = keras.Sequential([keras.Input((6,)), keras.layers.Dropout(0.2), keras.layers.Dense(8, activation="relu"),
                          keras.layers.Dense(2)])
model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
model.fit(x, y, batch_size=32, epochs=2, validation_split=0.2,
          callbacks=[keras.callbacks.ModelCheckpoint(sys.argv[1], save_best_only=True)])
print("evaluate", model.evaluate(x, y, batch_size=32))
print("predict", model.predict(x[:64], batch_size=32).sum())
