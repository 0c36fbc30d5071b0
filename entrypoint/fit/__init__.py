"""What happens inside `fit`: the concerns the fit hook (runner.py) composes: checkpoints, the resume and the
input positioned, the stop, the stall watchdog, the step observers, the non-trainable state, global batches, each
rank's own state, every fit a stage, the callbacks' state."""
