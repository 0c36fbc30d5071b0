"""A PyDataset and a Python generator positioned for an exact resume (resume.py positions numpy and tf.data).

- A PyDataset (tf_keras: `Sequence`) that fit reads in order (`shuffle=False`) is positioned by index: in the
  resumed epoch, the step that reads batch i reads the script's batch S + i (S: the steps done before the stop),
  and its `on_epoch_end` is called once for each epoch done before, as the run never stopped called it, so a
  seeded reshuffle there draws the same orders again. Fit's `shuffle=True` (Keras' default) draws each epoch's
  order from Python's `random` inside Keras, another one in a new process: not positioned, said in one line.
- A Python generator with `steps_per_epoch` is one stream for the whole fit (Keras keeps one iterator): it is
  positioned by replay, its batches already trained read and passed over without training.

Both are checked: a checkpoint records a digest of the last batch trained (sampled_digest), and the resumed
process compares it with the batch at that position, one line where they differ (augmentation drawing random
numbers, an order the script draws otherwise): the resume then trains other batches than the run never stopped.
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import random
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np

DIGEST_SAMPLES = 4096  # elements of each array a digest reads, evenly strided: cheap on any batch size
DIGESTS_KEPT = 1024  # a generator's batches read ahead of training (Keras' prefetch) whose digests are kept


def is_indexed(x: Any) -> bool:
    """A keras.utils.PyDataset / tf_keras Sequence: batches by index, an epoch's length, on_epoch_end."""
    return _sequence_base(x) is not None


def is_generator(x: Any) -> bool:
    return hasattr(x, "__next__") and hasattr(x, "__iter__") and not hasattr(x, "element_spec")


def why_not(x: Any, arguments: dict) -> str | None:
    """Why this PyDataset or generator cannot be positioned, or None."""
    if is_indexed(x):
        if arguments.get("steps_per_epoch"):
            return "steps_per_epoch over a PyDataset is not positioned"
        if arguments.get("shuffle", True) is not False:
            return ("fit's shuffle=True over a PyDataset draws its order from Python's random in each process, so "
                    "it is not positioned (pass shuffle=False; shuffle in on_epoch_end with a seed)")
        if len(x) == 0:
            return "an empty PyDataset is not positioned"
        return None
    if not arguments.get("steps_per_epoch"):
        return "a generator without steps_per_epoch is not positioned"
    return None


def sampled_digest(batch: Any) -> str:
    """A digest of a batch's arrays (tuples, lists and dicts of them): shapes, dtypes and up to DIGEST_SAMPLES
    evenly strided elements of each, enough to tell one batch from another without reading all of its bytes."""
    digest = hashlib.blake2b(digest_size=12)
    for leaf in _leaves(batch):
        array = np.asarray(leaf)
        digest.update(f"{array.shape}{array.dtype}".encode())
        flat = array.reshape(-1)
        digest.update(np.ascontiguousarray(flat[:: max(1, flat.size // DIGEST_SAMPLES)]).tobytes())
    return digest.hexdigest()


def _leaves(batch: Any) -> Iterator[Any]:
    if isinstance(batch, Mapping):
        for key in sorted(batch, key=str):
            yield from _leaves(batch[key])
    elif isinstance(batch, (tuple, list)) and not (batch and isinstance(batch[0], (int, float))):
        for item in batch:
            yield from _leaves(item)
    elif batch is not None:
        yield batch


@contextlib.contextmanager
def _random_state_kept() -> Iterator[None]:
    """A batch read only to digest it leaves Python's and NumPy's global random state as it found them."""
    python_state, numpy_state = random.getstate(), np.random.get_state()
    try:
        yield
    finally:
        random.setstate(python_state)
        np.random.set_state(numpy_state)


class PositionedInput:
    """The script's PyDataset or generator as fit reads it now, and what a checkpoint records of it."""

    def __init__(self, x: Any, last_trained: Callable[[int, int], str | None], resumed_epoch: int,
                 resumed_epoch_begun: threading.Event | None = None,
                 check_at_resumed_epoch: Callable[[], None] | None = None) -> None:
        self.x = x
        self._last_trained = last_trained
        self.resumed_epoch = resumed_epoch
        self.resumed_epoch_begun = resumed_epoch_begun or threading.Event()  # told by epoch_began
        self._check = check_at_resumed_epoch

    def last_batch_digest(self, epoch: int, step: int) -> str | None:
        """The digest of the batch trained last before position (epoch, step); None where it is not known."""
        return self._last_trained(epoch, step)

    def epoch_began(self, epoch: int) -> None:
        """Told by the training position as each epoch begins."""
        if epoch >= self.resumed_epoch and not self.resumed_epoch_begun.is_set():
            self.resumed_epoch_begun.set()
            if self._check is not None:
                self._check()


def positioned(x: Any, *, epoch: int, step: int, first_epoch: int, steps_per_epoch: int | None,
               recorded_digest: str | None, note: Callable[[str], None]) -> PositionedInput:
    """`x` (a PyDataset or generator that why_not accepts) positioned at `epoch`, `step` of a fit whose first epoch
    is `first_epoch`; `recorded_digest`: the checkpoint's digest of the last batch trained, checked here."""
    if is_indexed(x):
        return _positioned_by_index(x, epoch, epoch - first_epoch, step, recorded_digest, note)
    assert steps_per_epoch is not None  # why_not refuses a generator without it
    return _positioned_by_replay(x, (epoch - first_epoch) * steps_per_epoch + step, first_epoch, steps_per_epoch,
                                 recorded_digest, note)


def _positioned_by_index(sequence: Any, epoch: int, epochs_done: int, step: int, recorded: str | None,
                         note: Callable[[str], None]) -> PositionedInput:
    for _ in range(epochs_done):  # the run never stopped called it at each epoch's end
        sequence.on_epoch_end()

    def check() -> None:  # as the resumed epoch begins: Keras 3.15 calls on_epoch_end once as a fit starts
        with _random_state_kept():
            if sampled_digest(sequence[step - 1]) != recorded:
                note(f"the PyDataset's batch {step} of this epoch (counted from 1) reads otherwise than before the "
                     "stop (random augmentation, or an order its on_epoch_end draws otherwise): the resumed epoch "
                     "trains other batches")

    def last_trained(_epoch: int, at_step: int) -> str | None:
        if not at_step:
            return None
        with _random_state_kept():
            return sampled_digest(sequence[at_step - 1])

    begun = threading.Event()
    return PositionedInput(_from_step(sequence, step, begun) if step else sequence, last_trained, epoch, begun,
                           check if step and recorded else None)


def _from_step(sequence: Any, step: int, resumed_epoch_begun: threading.Event) -> Any:
    """A PyDataset whose batch i is the script's batch `step` + i until the end of the resumed epoch, the script's
    own batch i after. Its length stays the epoch's (Keras counts the steps by it and passes over the first `step`
    itself: starting.py); what Keras reads ahead past the epoch's end is the last batch, never trained. The
    resumed epoch ends at the first on_epoch_end after it began: Keras 3.15 calls one as each fit starts, tf_keras'
    worker processes one when their epoch's batches are read."""
    base = _sequence_base(sequence)

    class FromStep(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            if base.__name__ == "PyDataset":
                super().__init__(workers=getattr(sequence, "workers", 1),
                                 use_multiprocessing=getattr(sequence, "use_multiprocessing", False),
                                 max_queue_size=getattr(sequence, "max_queue_size", 10))
            self.offset = step

        def __len__(self) -> int:
            return len(sequence)

        def __getitem__(self, index: int) -> Any:
            return sequence[min(index + self.offset, len(sequence) - 1)]

        def on_epoch_begin(self) -> None:  # Keras 3.15 calls it; Keras 3.3 and tf_keras have none
            getattr(sequence, "on_epoch_begin", lambda: None)()

        def on_epoch_end(self) -> None:
            if resumed_epoch_begun.is_set():
                self.offset = 0
            sequence.on_epoch_end()

    return FromStep()


def _sequence_base(x: Any) -> type | None:
    """Keras 3's PyDataset or tf_keras' Sequence among x's classes, or None."""
    for cls in type(x).__mro__:
        if cls.__name__ in ("PyDataset", "Sequence") and cls.__module__.split(".")[0] in ("keras", "tf_keras"):
            return cls
    return None


def _positioned_by_replay(generator: Any, passed: int, first_epoch: int, steps_per_epoch: int,
                          recorded: str | None, note: Callable[[str], None]) -> PositionedInput:
    """The generator with its first `passed` batches read and passed over (when fit reads its first batch), each
    batch read after digested so that a checkpoint can record the last one trained."""
    digests: collections.OrderedDict[int, str] = collections.OrderedDict()

    def replayed() -> Iterator[Any]:
        for _ in range(passed):
            try:
                batch = next(generator)
            except StopIteration:
                note(f"the generator ended within the {passed} batches a resume passes over")
                return
        if passed and recorded and sampled_digest(batch) != recorded:
            note(f"the generator's batch {passed} (counted from 1), passed over, is not the one trained last before "
                 "the stop: it gives other batches in a new process (random numbers without a seed?), the resume "
                 "trains other batches")
        index = passed
        for batch in generator:
            digests[index] = sampled_digest(batch)
            while len(digests) > DIGESTS_KEPT:
                digests.popitem(last=False)
            index += 1
            yield batch

    def last_trained(epoch: int, step: int) -> str | None:
        return digests.get((epoch - first_epoch) * steps_per_epoch + step - 1)

    return PositionedInput(replayed(), last_trained, first_epoch + passed // steps_per_epoch)
