"""Zero-code Horovod averages every batch's logs over the ranks only where something reads them (fit/sync.py):
the progress bar, or a callback with a batch-end hook of its own; a fit whose batch logs nobody reads pays
nothing for it."""

from entrypoint.fit.sync import reads_batch_logs


class Callback:  # stands for Keras' base class: its hooks do nothing
    def on_train_batch_end(self, batch, logs=None):  # noqa: ANN001, ANN201
        pass

    def on_batch_end(self, batch, logs=None):  # noqa: ANN001, ANN201
        pass

    def on_epoch_end(self, epoch, logs=None):  # noqa: ANN001, ANN201
        pass


class EpochTimer(Callback):
    def on_epoch_end(self, epoch, logs=None):  # noqa: ANN001, ANN201
        pass


class BatchLosses(Callback):
    def on_train_batch_end(self, batch, logs=None):  # noqa: ANN001, ANN201
        pass


class Lambda(Callback):  # as Keras' LambdaCallback: the hooks given are set on the instance
    def __init__(self, **hooks) -> None:  # noqa: ANN003
        for name, hook in hooks.items():
            setattr(self, name, hook)


def test_the_progress_bar_reads_every_batch():
    assert reads_batch_logs(Callback, 1, []) and reads_batch_logs(Callback, "auto", [])


def test_one_line_an_epoch_and_epoch_hooks_read_no_batch():
    assert not reads_batch_logs(Callback, 2, [EpochTimer(), Lambda(on_epoch_end=print)])
    assert not reads_batch_logs(Callback, 0, [])


def test_a_batch_hook_of_a_class_or_of_an_instance_reads_every_batch():
    assert reads_batch_logs(Callback, 0, [EpochTimer(), BatchLosses()])
    assert reads_batch_logs(Callback, 2, [Lambda(on_train_batch_end=print)])
