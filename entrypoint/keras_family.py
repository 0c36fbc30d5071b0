"""What differs between the two Keras families distrain drives, declared once: Keras 3 (`keras`) and tf_keras
(legacy Keras 2). The Plan chooses the family (plan.py: `_keras`); every other module reads `plan.family` for what
it needs, never the family's name.

Each field names a difference the code acts on, and where: keeping them here means a third family (or a Keras 3
that behaves like tf_keras in one respect) is one new row, not a search through the package.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class KerasFamily:
    name: str  # the Plan's value: keras3 | legacy
    title: str  # as messages name it
    # runtime.setup: `import keras` must be made to mean the loaded tf_keras (compat/tf_keras_alias.py)
    aliased_as_keras: bool
    # runtime.setup: compat/keras3_mwm.py's fixes for fit under a strategy with several replicas
    needs_strategy_fit_fixes: bool
    # Horovod's Keras API (horovod.tensorflow.keras: DistributedOptimizer, its callbacks) drives this family; the
    # other goes through horovod.tensorflow (compat/keras3_horovod.py, horovod#4290)
    horovod_keras_api: bool
    # fit/checkpoint.py: the family's own BackupAndRestore is subclassed (tf_keras), or distrain's own callback
    # (Keras 3's cannot resume mid-epoch under a strategy)
    subclasses_backup_and_restore: bool
    # fit/resume.py: a resumed fit starts mid-epoch by passing over the epoch iterator's first steps (Keras 3), or
    # by answering tf_keras' own question for its first epoch and step
    starts_by_skipping_steps: bool
    # fit/unknown_length.py: the data handler keeps an epoch's length from the first epoch on (tf_keras), where
    # Keras 3's epoch iterator reads until the data ends in every epoch
    keeps_the_first_epochs_length: bool
    # fit/stages.py: a finished fit's weights, as `save_weights` names them (Keras 3 needs .weights.h5; tf_keras
    # writes a TensorFlow checkpoint)
    end_weights: str


KERAS3 = KerasFamily("keras3", "Keras 3", aliased_as_keras=False, needs_strategy_fit_fixes=True,
                     horovod_keras_api=False, subclasses_backup_and_restore=False, starts_by_skipping_steps=True,
                     keeps_the_first_epochs_length=False, end_weights="end.weights.h5")
TF_KERAS = KerasFamily("legacy", "tf_keras", aliased_as_keras=True, needs_strategy_fit_fixes=False,
                       horovod_keras_api=True, subclasses_backup_and_restore=True, starts_by_skipping_steps=False,
                       keeps_the_first_epochs_length=True, end_weights="end")
FAMILIES = {family.name: family for family in (KERAS3, TF_KERAS)}
