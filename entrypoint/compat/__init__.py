"""Workarounds for other libraries' defects, one module each, each naming the upstream issue it answers and
checking that what it corrects is really there, so that it can be deleted the day upstream fixes it.

- tf_keras_alias: `import keras` means tf_keras when a run uses legacy Keras.
- keras3_mwm: Keras 3 `fit`/`evaluate`/`predict` under MultiWorkerMirroredStrategy (keras#20585, tf#72388).
- keras3_horovod: Horovod for Keras 3 through `horovod.tensorflow` (horovod#4290: its Keras API cannot).
- horovod_metric_states, metric_reads: fit's metric logs from the states of every rank or worker (#69).
- registry: every replacement declared and checked; targets: where a replaced function lives.
"""
