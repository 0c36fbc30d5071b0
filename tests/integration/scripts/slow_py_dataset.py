"""A PyDataset whose batches take time to make, in worker processes (`use_multiprocessing=True`), as a script
reading images from disk writes it."""
import time

import keras
import numpy as np


class SlowBatches(keras.utils.PyDataset):
    def __init__(self) -> None:
        super().__init__(workers=2, use_multiprocessing=True)
        data = np.random.default_rng(0)
        self.x = data.normal(size=(640, 8)).astype("float32")
        self.y = (self.x.sum(axis=1) > 0).astype("int64")

    def __len__(self) -> int:
        return 20

    def __getitem__(self, index: int) -> tuple:
        time.sleep(0.4)
        return self.x[index * 32:(index + 1) * 32], self.y[index * 32:(index + 1) * 32]


keras.utils.set_random_seed(0)
model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(2)])
model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
model.fit(SlowBatches(), epochs=30, verbose=2)
