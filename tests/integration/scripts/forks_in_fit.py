"""A script whose fit forks a process (as PyDataset's `use_multiprocessing` and a multiprocessing Pool do) and
terminates it, as `pool.terminate()` does: prints the child's exit code (-15, SIGTERM's, under plain python). Then
it terminates children the moment they are forked, as Keras 3.3's PyDataset does with a pool it has just started
when an epoch ends as the next begins: prints how many ended (all, under plain python); one more forked from
another thread, as PyDataset's enqueuer forks."""
import multiprocessing
import threading
import time

import keras
import numpy as np


class ForkAndTerminate(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        if batch == 0:
            child = multiprocessing.get_context("fork").Process(target=time.sleep, args=(30,))
            child.start()
            time.sleep(0.5)
            child.terminate()
            child.join(timeout=10)
            print(f"child exit code {child.exitcode}", flush=True)
            if child.exitcode is None:
                child.kill()
        if batch == 1:
            ended = sum(terminated_at_once() == -15 for _ in range(CHILDREN))
            print(f"children terminated at once: {ended} of {CHILDREN} ended", flush=True)
            from_a_thread = threading.Thread(target=terminated_at_once)  # as PyDataset's enqueuer forks
            from_a_thread.start()
            from_a_thread.join(timeout=10)


CHILDREN = 20


def terminated_at_once() -> int | None:
    child = multiprocessing.get_context("fork").Process(target=time.sleep, args=(30,))
    child.start()
    child.terminate()
    child.join(timeout=5)
    if child.exitcode is None:
        child.kill()
        child.join()
        return None
    return child.exitcode


model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
model.compile("sgd", "mse")
model.fit(np.zeros((8, 4)), np.zeros((8, 1)), batch_size=4, epochs=1, verbose=0, callbacks=[ForkAndTerminate()])
