"""The registry's table: every replacement, wrapper and private read of another library's function, method,
attribute or module layout that distrain makes (compat/registry.py checks them, `distrain doctor` lists them).

Each entry names its targets as `module:qualified.name`, optionally with the leading parameters the replacement
relies on (`reduce_per_replica(values,strategy,reduction)`); `a|b` are alternatives (one Keras names it a, another
b); a trailing `?` marks a target some proven versions lack (the fix then does nothing). A `keras` target is
tf_keras' under tf_keras.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..keras_family import FAMILIES, KERAS3, TF_KERAS

ALL_MODES = frozenset({"single", "mirrored", "mwm", "horovod"})
STRATEGY_MODES = frozenset({"mirrored", "mwm"})

# the versions every entry was proven with (CI: the first two lines; 2.22.0rc0 with keras-nightly: by hand, #68)
PROVEN = {
    "tensorflow": "2.17.1, 2.21.0, 2.22.0rc0",
    "keras": "3.3.2, 3.15.1, 3.16.0.dev (keras-nightly)",
    "tf_keras": "2.17.0, 2.21.0",
    "horovod": "0.28.1",
    "python": "3.11",
}

@dataclass(frozen=True)
class Patch:
    name: str  # the `# patch: <name>` marker where it is made
    what: str
    kind: str  # replaces | wraps | reads
    lifetime: str  # process | fit (restored after each fit) | call (a with-block) | instance (one object)
    why: str  # the upstream issue, or the promise it serves
    targets: tuple[str, ...]
    library: str  # whose version a refusal names: tensorflow | keras | tf_keras | horovod | python
    families: frozenset = frozenset(FAMILIES)
    modes: frozenset = ALL_MODES

    def applies(self, family: str, mode: str) -> bool:
        return family in self.families and mode in self.modes

    def library_for(self, family: str) -> str:
        """Whose internals the targets are under `family`: a `keras` target is tf_keras' under tf_keras."""
        return FAMILIES[family].module if self.library == KERAS3.module else self.library


def _p(name: str, what: str, kind: str, lifetime: str, why: str, targets: tuple[str, ...], library: str,
       families: tuple[str, ...] = tuple(FAMILIES), modes: frozenset = ALL_MODES) -> Patch:
    return Patch(name, what, kind, lifetime, why, targets, library, frozenset(families), modes)


_TRAINER = "keras.src.backend.tensorflow.trainer"
_SAVING = "keras.src.saving.saving_lib"
_TF_OPT = "keras.src.backend.tensorflow.optimizer:TFOptimizer"
_BASE_OPT = "keras.src.optimizers.base_optimizer:BaseOptimizer"
_CARS = "tensorflow.python.distribute.collective_all_reduce_strategy"
_CDO = "tensorflow.python.distribute.cross_device_ops"
_DATA = "tensorflow.python.data.ops"
_K3 = (KERAS3.name,)
_LEGACY = (TF_KERAS.name,)

PATCHES: tuple[Patch, ...] = (
    # Keras 3 under a strategy with several replicas (compat/keras3_mwm.py: each fix checks its defect's source)
    _p("keras3_mwm.scalar_reduce", "reduce_per_replica reduces scalars with axis=None", "replaces", "process",
       "tensorflow/tensorflow#72388, keras-team/keras#20585",
       (f"{_TRAINER}:reduce_per_replica(values,strategy,reduction)", f"{_TRAINER}:_collective_all_reduce_multi_worker"),
       "keras", _K3, STRATEGY_MODES),
    _p("keras3_mwm.symbolic_build", "the symbolic build reads the input's element spec (or the first local "
       "replica's batch), not a batch of the script's input", "wraps", "process",
       "keras-team/keras#20585; #69: the batch read was lost to a Python generator or PyDataset, and drew a "
       "reshuffling dataset's first order (Keras 3.15)",
       (f"{_TRAINER}:TensorFlowTrainer._maybe_symbolic_build(self,iterator,data_batch)"
        f"|{_TRAINER}:Trainer._maybe_symbolic_build(self,iterator,data_batch)?",
        f"{_TRAINER}:TensorFlowTrainer()._distribute_strategy|{_TRAINER}:Trainer()._distribute_strategy"), "keras",
       _K3, STRATEGY_MODES),
    _p("keras3_mwm.reduce_before_merge", "gradients all-reduced in replica context, before the merge call",
       "wraps", "process", "keras-team/keras#19969",
       (f"{_TF_OPT}._backend_update_step(self,grads,trainable_variables,learning_rate)",
        f"{_TF_OPT}._distributed_tf_update_step"), "keras", _K3, STRATEGY_MODES),
    _p("keras3_mwm.metric_states", "metric states summed across workers before the results are read", "wraps",
       "process", "variables created without their aggregation (Keras 3.3)",
       (f"{_TRAINER}:TensorFlowTrainer._get_metrics_result_or_logs(self,logs)"
        f"|{_TRAINER}:Trainer._get_metrics_result_or_logs(self,logs)",
        "keras.src.backend.tensorflow:Variable._initialize"),
       "keras", _K3, STRATEGY_MODES),
    _p("keras3_mwm.clip_after_reduce", "gradients clipped after the all-reduce; the optimizer's own skips them",
       "wraps", "process", "#67: each replica clipped its own share (Keras 3.3 to 3.16)",
       (f"{_BASE_OPT}._clip_gradients(self,grads)", f"{_TF_OPT}._all_reduce_sum_gradients(self,grads_and_vars)",
        f"{_BASE_OPT}._backend_apply_gradients"), "keras", _K3, STRATEGY_MODES),
    _p("keras3_mwm.mean_no_nan", "an empty replica batch's loss is 0, not NaN", "wraps", "process",
       "tensorflow/tensorflow#36224", ("keras.src.losses.loss:reduce_values(values)?",), "keras", _K3, STRATEGY_MODES),
    _p("keras3_mwm.predict_on_batch", "predict_on_batch returns the first replica's copy of its predictions",
       "wraps", "process", "#69: N replicas returned N copies of the batch's predictions (Keras 3.3 to 3.16)",
       (f"{_TRAINER}:TensorFlowTrainer.predict_on_batch(self,x)|{_TRAINER}:Trainer.predict_on_batch(self,x)",),
       "keras", _K3, STRATEGY_MODES),
    _p("keras3_mwm.custom_step_loss", "a Mean metric updated with compute_loss's own value gets it unscaled",
       "wraps", "process", "#69: a custom train_step logged 1/replicas of the loss (Keras 3.15, 3.16)",
       ("keras.src.trainers.trainer:Trainer.compute_loss(self)|keras.src.trainers.trainer:BaseTrainer.compute_loss(self)",
        "keras.src.metrics.reduction_metrics:Mean.update_state(self,values)"), "keras", _K3, STRATEGY_MODES),
    _p("keras3_mwm.one_step_per_execution", "whether steps_per_execution's loop is the tf.while_loop MWM fails in",
       "reads", "process", "#69: steps_per_execution > 1 under MWM failed in the train function (Keras 3.15)",
       (f"{_TRAINER}:TensorFlowTrainer._make_function(self,step_function)"
        f"|{_TRAINER}:Trainer._make_function(self,step_function)?",), "keras", _K3, frozenset({"mwm"})),
    _p("keras3_mwm.int64_seeds", "SeedGenerator's state created as int64", "wraps", "process",
       "keras-team/keras#19928 (uint32 cannot be broadcast)",
       ("keras.src.random.seed_generator:SeedGenerator.__init__(self,seed,name)",), "keras", _K3, STRATEGY_MODES),
    _p("keras3_saving.plain_reference_objects", "saving's throwaway reference objects get plain variables",
       "wraps", "process", "#69: a worker's first load_model broadcast two variables the chief never made: the "
       "workers' collectives mismatched (Keras 3.3 builds them once a process)",
       (f"{_SAVING}:get_attr_skiplist(obj_type)|{_SAVING}:get_attr_skipset(obj_type)",), "keras", _K3,
       STRATEGY_MODES),
    _p("checkpoint_snapshot.h5_store", "Keras' weights-file store, while a checkpoint's snapshot is taken: a "
       "recorder of the groups and arrays save_weights gives it, replayed into Keras' own store by the writer; the "
       "optimizer gives it its variables, not copies", "replaces", "call",
       "checkpoints off the training's path (#87); the file is the one save_weights writes",
       (f"{_SAVING}:H5IOStore", f"{_SAVING}:H5IOStore.make(self,path)", f"{_SAVING}:save_weights_only(model,filepath)",
        "keras.src.optimizers.base_optimizer:BaseOptimizer.save_own_variables(self,store)"),
       "keras", _K3),
    _p("checkpoint_snapshot.tf_writes", "TensorFlow's checkpoint-writing ops, CheckpointManager's state file and "
       "deletions, while tf_keras' checkpoint is saved: recorders of the calls (with the tensors read) the writer runs",
       "replaces", "call", "checkpoints off the training's path (#87); the files are the ones the save writes",
       ("tensorflow.python.ops.io_ops:save_v2(prefix,tensor_names,shape_and_slices,tensors)",
        "tensorflow.python.ops.gen_io_ops:merge_v2_checkpoints(checkpoint_prefixes,destination_prefix)",
        "tensorflow.python.checkpoint.checkpoint_management:update_checkpoint_state_internal(save_dir,"
        "model_checkpoint_path)", "tensorflow.python.checkpoint.checkpoint_management:_delete_file_if_exists(filespec)",
        "tensorflow.python.checkpoint.functional_saver:_single_shard_save(file_prefix,shard)"),
       "tensorflow", _LEGACY),
    _p("epoch_iterators.keras3", "how many iterators fit makes of a dataset each epoch (its source)",
       "reads", "process", "#69: Keras 3.15 draws two orders of a seeded reshuffle an epoch, distrain's one drew one",
       ("keras.src.trainers.epoch_iterator:EpochIterator._enumerate_iterator(self)?",), "keras", _K3),
    _p("epoch_iterators.tf_keras", "whether fit makes an unread iterator of a dataset before its first epoch",
       "reads", "process", "#69: tf_keras trains orders 2, 3, 4 of a seeded reshuffle, distrain's drew 1, 2, 3",
       ("tf_keras.src.engine.data_adapter:DataHandler.enumerate_epochs(self)",), "tf_keras", _LEGACY),
    _p("numpy_orders.global_seed", "TensorFlow's global seed, read without drawing an operation seed", "reads",
       "process", "#69 finding 8: numpy input's orders are Keras' own where the script seeded TensorFlow",
       ("tensorflow.python.eager.context:global_seed()",), "tensorflow"),
    _p("numpy_orders.keras3_adapter", "Keras' array adapter draws the permutation fit trains of numpy input",
       "reads", "process", "#69 finding 8: distrain's numpy pipeline trained another order than plain python",
       ("keras.src.trainers.data_adapters.array_data_adapter:ArrayDataAdapter(x,y,sample_weight,batch_size,steps,"
        "shuffle)", "keras.src.trainers.data_adapters.array_data_adapter:ArrayDataAdapter.get_tf_dataset(self)"),
       "keras", _K3),
    _p("numpy_orders.tf_keras_adapter", "tf_keras' array adapter draws the permutations fit trains of numpy input",
       "reads", "process", "#69 finding 8: distrain's numpy pipeline trained another order than plain python",
       ("tf_keras.src.engine.data_adapter:TensorLikeDataAdapter(x,y,sample_weights,sample_weight_modes,batch_size,"
        "epochs,steps,shuffle)", "tf_keras.src.engine.data_adapter:TensorLikeDataAdapter.get_dataset(self)"),
       "tf_keras", _LEGACY),
    _p("tf_checkpoint.one_writer", "tf.train.Checkpoint's writes, CheckpointManager's state file and deletions "
       "of old checkpoints, tf.saved_model.save, go through the script's saves: the chief writes, the others wait",
       "wraps",
       "process", "#69: every rank wrote one checkpoint path (MergeV2Checkpoints: a part 'did not exist'), then a "
       "hang", ("tensorflow.python.checkpoint.checkpoint:Checkpoint._write(self,file_prefix,options)",
                "tensorflow.python.checkpoint.checkpoint_management:update_checkpoint_state_internal(save_dir)",
                "tensorflow.python.checkpoint.checkpoint_management:_delete_file_if_exists(filespec)",
                "tensorflow.python.saved_model.save:save(obj,export_dir)"),
       "tensorflow", modes=frozenset({"mwm", "horovod"})),
    _p("keras3_trainer.class", "Keras 3's TensorFlow trainer class, under either name", "reads", "process",
       "TensorFlowTrainer up to 3.15, Trainer in 3.16", (f"{_TRAINER}:TensorFlowTrainer|{_TRAINER}:Trainer",),
       "keras", _K3),
    # Horovod
    _p("keras3_horovod.optimizer_apply", "the optimizer's apply averages the gradients over the ranks", "wraps",
       "instance", "horovod/horovod#4290 (Horovod's Keras API does not take Keras 3)",
       (f"{_BASE_OPT}.apply(self,grads,trainable_variables)",), "keras", _K3, frozenset({"horovod"})),
    _p("keras3_horovod.tf_variables", "hvd.broadcast_variables and DistributedGradientTape take Keras 3 variables",
       "wraps", "process", "horovod/horovod#4290",
       ("horovod.tensorflow:broadcast_variables(variables,root_rank)", "horovod.tensorflow:DistributedGradientTape"),
       "horovod", _K3, frozenset({"horovod"})),
    _p("horovod_loop_statistics.tape", "a custom loop's DistributedGradientTape also averages BatchNorm statistics",
       "wraps", "process", "a Horovod custom loop leaves each rank its own moving statistics (rank 0 saves its own)",
       ("horovod.tensorflow:broadcast_variables(variables,root_rank)", "horovod.tensorflow:DistributedGradientTape"),
       "horovod", modes=frozenset({"horovod"})),
    _p("horovod_fused_logs.train_step", "Keras' own train_step under zero-code Horovod: the optimizer's update "
       "held until the step's logs exist, the logs averaged within the gradients' all-reduce", "replaces", "instance",
       "#87 item 3: the logs' own all-reduce cost a negotiation round a step (0.84 of hand-written Horovod)",
       ("keras.src.engine.training:Model.train_step(self,data)|"
        "keras.src.backend.tensorflow.trainer:TensorFlowTrainer.train_step(self,data)|"
        "keras.src.backend.tensorflow.trainer:Trainer.train_step(self,data)",
        "horovod._keras:create_distributed_optimizer()._allreduce_grads",
        "horovod._keras:create_distributed_optimizer()._agg_helper",
        "horovod._keras:create_distributed_optimizer(keras,optimizer,name,device_dense,device_sparse,compression,"
        "sparse_as_dense,gradient_predivide_factor,op)"),
       "horovod", modes=frozenset({"horovod"})),
    _p("horovod.distributed_optimizer", "the optimizer wrapped once in hvd.DistributedOptimizer, its class saved "
       "under its base class's module", "replaces", "instance", "a model saved with Horovod's class loads only "
       "with Horovod",
       ("tf_keras.src.optimizers:Optimizer", "horovod.tensorflow.keras:DistributedOptimizer(optimizer)"),
       "horovod", _LEGACY, frozenset({"horovod"})),
    # every fit
    _p("runner.model_hooks", "Model.fit, compile, save, save_weights, evaluate and predict, where the concerns of "
       "a distributed fit meet", "wraps", "process", "distrain's own: the script runs unchanged; a save is written "
       "once and seen by every rank when its call returns",
       ("keras:Model.fit(self,x,y,batch_size,epochs)", "keras:Model.compile", "keras:Model.save(self,filepath)",
        "keras:Model.save_weights(self,filepath)", "keras:Model.export(self,filepath)?",
        "keras:Model.evaluate(self,x,y,batch_size,verbose)", "keras:Model.predict(self,x,batch_size,verbose)"),
       "keras"),
    _p("saves.callback_files", "TensorBoard's log_dir and CSVLogger's filename, on ranks but the chief, a private "
       "temporary directory during the fit", "replaces", "fit", "#69: every rank wrote its event files and the CSV "
       "into the script's directory", ("keras.callbacks:TensorBoard(log_dir)",
                                       "keras.callbacks:CSVLogger(filename)"), "keras"),
    _p("saves.own_backup", "the script's own BackupAndRestore: written and deleted by the chief alone, read by "
       "every rank", "replaces", "fit", "#69: every rank wrote the backup: FileExistsError from one rank's "
       "check-then-mkdir", ("keras.src.callbacks.backup_and_restore:BackupAndRestore._save_model(self)",
                            "keras.src.callbacks.backup_and_restore:BackupAndRestore.on_train_end(self,logs)"),
       "keras", _K3),
    _p("steps.train_function", "the fit's train function calls the step observers after each call; the "
       "model's steps_per_execution read", "wraps", "fit", "one training position for checkpoint, stop and stall",
       ("keras:Model.make_train_function(self)", "keras:Model()._steps_per_execution?"), "keras"),
    _p("stages.history", "a finished fit's History given back on resume", "replaces", "instance",
       "a resumed script reads the History its skipped fit returned", ("keras.callbacks:History",), "keras"),
    _p("callback_state.restore", "the script's callbacks' counters (wait, best, ...) given back on resume",
       "replaces", "instance", "EarlyStopping and ReduceLROnPlateau decide as in the run never stopped",
       ("keras.callbacks:EarlyStopping", "keras.src.callbacks.early_stopping:EarlyStopping._set_monitor_op?"),
       "keras"),
    _p("resume.keras3_skipping", "the first epoch's epoch iterator passes over the steps already trained", "wraps",
       "fit", "exact resume mid-epoch",
       (f"{_TRAINER}:TFEpochIterator._enumerate_iterator(self)|{_TRAINER}:TFEpochIterator.enumerate_epoch(self)",
        f"{_TRAINER}:TensorFlowTrainer._maybe_symbolic_build|{_TRAINER}:Trainer._maybe_symbolic_build?"), "keras", _K3),
    _p("resume.keras3_build", "Keras 3's symbolic build from the script's dataset's spec", "wraps", "fit",
       "exact resume: a batch read for the build draws an order of a seeded reshuffle that plain python never draws",
       (f"{_TRAINER}:TensorFlowTrainer._maybe_symbolic_build(self,iterator,data_batch)"
        f"|{_TRAINER}:Trainer._maybe_symbolic_build(self,iterator,data_batch)?",
        f"{_TRAINER}:TensorFlowTrainer()._distribute_strategy|{_TRAINER}:Trainer()._distribute_strategy"), "keras",
       _K3),
    _p("tf_keras_mwm.first_replica_logs", "a model's distribute_reduction_method 'first' where it is 'auto'",
       "replaces", "instance", "keras-team/keras#16664: under MWM the step's synchronised logs were summed over the "
       "workers (train_on_batch's loss x N)",
       ("tf_keras.src.engine.training:reduce_per_replica(values,strategy,reduction)",
        "tf_keras.src.engine.training:Model.distribute_reduction_method"), "tf_keras", _LEGACY, frozenset({"mwm"})),
    _p("tf_keras_mwm.custom_step_logs", "a script's own train_step/test_step: what it returns averaged over the "
       "replicas (summed where it scales its loss itself), read once: the model's reduction 'first'", "wraps",
       "process", "a script's own step under a strategy returned each replica's values, which tf_keras summed "
       "(every batch's logged loss x N)",
       ("tf_keras.src.engine.training:reduce_per_replica(values,strategy,reduction)",
        "tf_keras.src.engine.training:Model.distribute_reduction_method",
        "tf_keras.src.engine.training:Model.train_step(self,data)",
        "tf_keras.src.engine.training:Model.test_step(self,data)"), "tf_keras", _LEGACY, STRATEGY_MODES),
    _p("tf_keras_mwm.custom_step_gradients", "within a script's own step: tf_keras' loss scaling undone, the "
       "gradients averaged (not summed) over the replicas", "wraps", "process",
       "a script's own train_step computing its loss itself (Keras' guide) trained with N x the gradient under a "
       "strategy, and one given compute_loss's value logged it scaled by 1/N",
       ("tf_keras.src.utils.losses_utils:scale_loss_for_distribution(loss_value)",
        "tf_keras.src.optimizers.utils:all_reduce_sum_gradients(grads_and_vars)"), "tf_keras", _LEGACY,
       STRATEGY_MODES),
    _p("tf_keras_mwm.custom_step_losses", "a Loss object in a script's own step reduces to the batch's mean as in "
       "one process (Reduction.SUM: the step sums the replicas)", "replaces", "process",
       "tf_keras refused a Loss object's default reduction in a script's own step under a strategy (Keras' guide "
       "'Customizing what happens in fit()': ValueError 'Please use tf.keras.losses.Reduction.SUM')",
       ("tf_keras.src.losses:Loss._get_reduction(self)", "tf_keras.src.utils.losses_utils:ReductionV2.SUM"),
       "tf_keras", _LEGACY, STRATEGY_MODES),
    _p("tf_keras_mwm.weights_as_arrays", "a layer's weights read from a .weights.h5 file as arrays, then assigned",
       "wraps", "process", "tf_keras' load_weights of a .weights.h5 file under a strategy: a sync-on-read "
       "variable's assign divided the h5py dataset by the replicas (TypeError: unsupported operand type(s) for /)",
       ("tf_keras.src.engine.base_layer:Layer.load_own_variables(self,store)",), "tf_keras", _LEGACY,
       STRATEGY_MODES),
    _p("tf_keras_mwm.script_scales_its_loss", "tf.nn.compute_average_loss and scale_regularization_loss note a "
       "step that scales its loss for distribution itself (its gradients stay summed)", "wraps", "process",
       "a step written for a strategy (TensorFlow's custom training guide) must keep tf_keras' sum",
       ("tensorflow:nn.compute_average_loss(per_example_loss)",
        "tensorflow:nn.scale_regularization_loss(regularization_loss)"), "tensorflow", _LEGACY, STRATEGY_MODES),
    _p("resume.tf_keras_counters", "tf_keras' fit starts at the resumed epoch and step", "replaces", "fit",
       "exact resume mid-epoch",
       ("tf_keras.src.engine.training:Model._maybe_load_initial_counters_from_ckpt(self,steps_per_epoch)",),
       "tf_keras", _LEGACY),
    _p("checkpoint.tf_keras_backup", "tf_keras' BackupAndRestore: one writer, two checkpoints kept, the step kept",
       "reads", "instance", "MWM: every worker wrote a copy; a corrupt newest checkpoint falls back",
       ("tf_keras.src.callbacks:BackupAndRestore._backup(self,epoch,batch)",
        "tf_keras.src.callbacks:BackupAndRestore()._training_state",
        "tf_keras.src.callbacks:BackupAndRestore()._supported_strategies",
        "tf_keras.src.distribute.worker_training_state:WorkerTrainingState.delete_backup",
        "tf_keras.src.distribute.worker_training_state:WorkerTrainingState()._ckpt_saved_epoch",
        "tf_keras.src.distribute.worker_training_state:WorkerTrainingState()._ckpt_saved_batch?",
        "tf_keras.src.distribute.worker_training_state:WorkerTrainingState().read_checkpoint_manager",
        "tf_keras.src.distribute.worker_training_state:WorkerTrainingState().write_checkpoint_manager",
        "tensorflow.python.checkpoint.checkpoint_management:CheckpointManager()._max_to_keep"), "tf_keras",
       _LEGACY),
    _p("tf_keras_alias.keras_is_tf_keras", "`import keras` gives the loaded tf_keras modules", "replaces",
       "process", "a tf_keras script stays on tf_keras (TF_USE_LEGACY_KERAS redirects only tf.keras)",
       ("tf_keras:Model",), "tf_keras", _LEGACY),
    # TensorFlow
    _p("adopt.strategies", "the script's own strategy classes answer with distrain's strategy", "replaces",
       "process", "a script written for MWM or MirroredStrategy runs as under plain python",
       ("tensorflow:distribute.MultiWorkerMirroredStrategy", "tensorflow:distribute.MirroredStrategy",
        "tensorflow:distribute.OneDeviceStrategy"), "tensorflow"),
    _p("adopt.resolvers", "the script's cluster resolvers answer with the Plan's cluster", "replaces", "process",
       "SlurmClusterResolver sorts hosts as strings and shares ports between nodes",
       ("tensorflow:distribute.cluster_resolver.SlurmClusterResolver",
        "tensorflow:distribute.cluster_resolver.TFConfigClusterResolver",
        "tensorflow:distribute.cluster_resolver.SimpleClusterResolver"), "tensorflow"),
    _p("adopt.communication_options", "the script's CommunicationOptions set on distrain's strategy", "replaces",
       "instance", "the script's NCCL or RING choice honoured",
       (f"{_CARS}:CollectiveAllReduceExtended", f"{_CARS}:CollectiveAllReduceExtended()._communication_options",
        f"{_CARS}:CollectiveAllReduceExtended()._cross_device_ops",
        f"{_CARS}:CollectiveAllReduceExtended()._host_cross_device_ops",
        f"{_CDO}:CollectiveAllReduce()._options"), "tensorflow",
       modes=STRATEGY_MODES),
    _p("default_strategy.reset_default_graph", "distrain's strategy is the default again after the graph's reset",
       "wraps", "process", "#69: clear_session() (k-fold loops) dropped the default strategy: each rank then "
       "trained alone", ("tensorflow.compat.v1:reset_default_graph()",
                         "tensorflow.compat.v2.compat.v1:reset_default_graph()"), "tensorflow",
       modes=STRATEGY_MODES),
    _p("default_strategy.saved_model_load", "tf.saved_model.load outside the script's own strategy scope loads "
       "with no strategy, as under plain python", "wraps", "process", "#69: a model exported and served back failed "
       "under MWM (its variables restored as distributed ones)",
       ("tensorflow.saved_model:load(export_dir)", "tensorflow.python.framework.ops:Graph._distribution_strategy_stack",
        "tensorflow.python.framework.ops:Graph._global_distribute_strategy_scope"), "tensorflow",
       modes=STRATEGY_MODES),
    _p("default_strategy.scope_held", "the default strategy's scope object held by distrain, not only by the main "
       "thread's local storage", "reads", "process", "#69: each process PyDataset forked printed a traceback per epoch "
       "(the scope's variable_creator_scope closed in a thread that never entered it)",
       ("tensorflow.python.framework.ops:Graph._global_distribute_strategy_scope",), "tensorflow",
       modes=STRATEGY_MODES),
    _p("adopt.local_reads", "ON_READ variables read locally in cross-replica context", "replaces", "call",
       "one writer: the chief saves without a collective the other workers do not join",
       ("tensorflow.python.distribute.values:SyncOnReadVariable._get_cross_replica(self)",
        "tensorflow.python.distribute.values:SyncOnReadVariable._get_on_device_or_primary(self)",
        "tensorflow.python.ops.resource_variable_ops:ResourceVariable"), "tensorflow"),
    _p("script_gpu_pinning.device_calls", "tf.config's device calls see the task's GPUs only", "replaces",
       "process", "a script's own device configuration runs as under plain python",
       ("tensorflow:config.list_physical_devices", "tensorflow:config.set_visible_devices",
        "tensorflow:config.experimental.set_memory_growth"), "tensorflow"),
    _p("adopt.parameter_servers", "the script's ParameterServerStrategy refused with one line where distrain runs "
       "ranks", "replaces", "process", "#69: each rank would run the script's parameter-server cluster whole",
       ("tensorflow:distribute.ParameterServerStrategy", "tensorflow:distribute.experimental.ParameterServerStrategy?"),
       "tensorflow", modes=frozenset({"mirrored", "mwm", "horovod"})),
    _p("horovod_own_updates.keras3_optimizers", "an update by an optimizer nobody averages over the ranks: its "
       "gradients averaged within fit, refused with one line outside", "wraps", "process", "a custom loop or a "
       "train_step with its own optimizers trained each rank alone under zero-code Horovod, silently apart (#84: "
       "the keras-io GAN's, refused, now averaged)", (f"{_BASE_OPT}.apply(self,grads)",), "keras", _K3,
       frozenset({"horovod"})),
    _p("horovod_own_updates.tf_keras_optimizers", "the same for tf_keras' optimizers, new and legacy", "wraps",
       "process", "as horovod_own_updates.keras3_optimizers",
       ("keras.src.optimizers.optimizer:Optimizer.apply_gradients(self,grads_and_vars)",
        "keras.src.optimizers.legacy.optimizer_v2:OptimizerV2.apply_gradients(self,grads_and_vars)?"), "keras",
       _LEGACY, frozenset({"horovod"})),
    _p("horovod_metric_states.summed_reads", "fit's epoch and validation logs read from the metric states summed "
       "over the Horovod ranks", "wraps", "process", "#69: Horovod averaged the ranks' results: Precision, Recall "
       "and AUC logged other numbers than plain python's", ("keras.src.trainers.trainer:Trainer."
                                                             "_get_metrics_result_or_logs(self,logs)|keras.src."
                                                             "trainers.trainer:BaseTrainer."
                                                             "_get_metrics_result_or_logs(self,logs)",), "keras",
       _K3, frozenset({"horovod"})),
    _p("horovod_metric_states.tf_keras_summed_reads", "the same for tf_keras' read", "wraps", "process",
       "as horovod_metric_states.summed_reads", ("keras.src.engine.training:Model._validate_and_get_metrics_result"
                                                 "(self,logs)",), "keras", _LEGACY, frozenset({"horovod"})),
    _p("horovod_sync_batchnorm.keras3_moments", "BatchNormalization(synchronized=True) sums its moments over the "
       "Horovod ranks, as over a strategy's replicas", "replaces", "process", "#69: under zero-code Horovod (no "
       "strategy) each rank normalized its own share, silently not plain python's numbers (nor MWM's)",
       ("keras.src.backend.tensorflow.nn:_compute_moments_sync(x,axes,keepdims)"
        "|keras.src.backend.tensorflow.ops.nn:_compute_moments_sync(x,axes,keepdims)",), "keras", _K3,
       frozenset({"horovod"})),
    _p("horovod_sync_batchnorm.tf_keras_moments", "the same for tf_keras' BatchNormalization", "replaces",
       "process", "as horovod_sync_batchnorm.keras3_moments",
       ("keras.src.layers.normalization.batch_normalization:BatchNormalizationBase._sync_calculate_mean_and_var"
        "(self,x,reduction_axes,keep_dims,mask)",), "keras", _LEGACY, frozenset({"horovod"})),
    _p("downloads.keras3_get_file", "get_file (every keras.datasets loader's download) takes turns per cache "
       "under ranks: one downloads and extracts, the others read", "wraps", "process", "#84: ranks extracting "
       "one archive at once failed (NotFoundError: Could not find directory .../aclImdb/train)",
       ("keras.src.utils.file_utils:get_file(fname,origin,untar,md5_hash,file_hash,cache_subdir)",), "keras", _K3,
       frozenset({"mwm", "horovod"})),
    _p("downloads.tf_keras_get_file", "the same for tf_keras' get_file", "wraps", "process",
       "as downloads.keras3_get_file",
       ("keras.src.utils.data_utils:get_file(fname,origin,untar,md5_hash,file_hash,cache_subdir)",), "keras",
       _LEGACY, frozenset({"mwm", "horovod"})),
    _p("own_shards.dataset_graph", "a dataset's serialized graph, whose constants (files, shard indices, arrays) "
       "tell whether the ranks split it themselves", "reads", "call", "#84: a script sharding its own files was "
       "split again by MWM, half the data an epoch, silently",
       ("tensorflow.python.data.ops.dataset_ops:DatasetV2._as_serialized_graph(self,allow_stateful,"
        "strip_device_assignment)",), "tensorflow", modes=frozenset({"mwm", "horovod"})),
    _p("io_device.localhost", "experimental_io_device='/job:localhost' of SaveOptions, LoadOptions and "
       "CheckpointOptions is this MWM worker's host", "wraps", "process", "#84: TensorFlow's save-and-load "
       "tutorial under MWM: '/job:localhost/replica:0/task:0/device:CPU:0 unknown device'",
       ("tensorflow.python.saved_model.save_options:SaveOptions.__init__(self,namespace_whitelist)",
        "tensorflow.python.saved_model.load_options:LoadOptions.__init__(self,allow_partial_checkpoint)",
        "tensorflow.python.checkpoint.checkpoint_options:CheckpointOptions.__init__(self,experimental_io_device)"),
       "tensorflow", modes=frozenset({"mwm"})),
    _p("script_devices.logical_configuration", "a logical device configuration TensorFlow no longer takes is "
       "skipped with one line", "wraps", "process", "#69: TensorFlow's distributed-input tutorial splits the CPU "
       "itself: 'Virtual devices cannot be modified after being initialized' under MWM and Horovod",
       ("tensorflow:config.set_logical_device_configuration(device,logical_devices)",
        "tensorflow:config.experimental.set_virtual_device_configuration(device,logical_devices)?"), "tensorflow",
       modes=frozenset({"mirrored", "mwm", "horovod"})),
    _p("stopping.strategy_launchers", "the strategy's own all-reduce launcher and options for the stop check",
       "reads", "process", "a stop agreed without a traced function (falls back to the public way)",
       (f"{_CDO}:CollectiveAllReduce", f"{_CDO}:CollectiveAllReduce()._launchers",
        f"{_CARS}:CollectiveAllReduceExtended()._cross_device_ops",
        f"{_CARS}:CollectiveAllReduceExtended()._communication_options"), "tensorflow", modes=STRATEGY_MODES),
    _p("tfdata.pipeline_stages", "tf.data stages' inputs, batch sizes, buffers, seeds and map functions", "reads",
       "call", "input split, evened and positioned without reading it (any surprise: the public way)",
       ("tensorflow.python.data.ops.prefetch_op:_PrefetchDataset(input_dataset,buffer_size)",
        "tensorflow.python.data.ops.batch_op:_BatchDataset(input_dataset,batch_size,drop_remainder)",
        "tensorflow.python.data.ops.shuffle_op:_ShuffleDataset(input_dataset,buffer_size,seed)",
        "tensorflow.python.data.ops.map_op:_MapDataset(input_dataset,map_func)",
        f"{_DATA}.dataset_ops:UnaryDataset()._input_dataset", f"{_DATA}.dataset_ops:DatasetV2._inputs",
        f"{_DATA}.prefetch_op:_PrefetchDataset()._buffer_size", f"{_DATA}.batch_op:_BatchDataset()._batch_size",
        f"{_DATA}.batch_op:_BatchDataset()._drop_remainder", f"{_DATA}.shuffle_op:_ShuffleDataset()._seed",
        f"{_DATA}.shuffle_op:_ShuffleDataset()._seed2", f"{_DATA}.map_op:_MapDataset()._map_func",
        f"{_DATA}.map_op:_ParallelMapDataset()._deterministic"), "tensorflow"),
    # Python
    _p("startup_stop.wakeup_fd", "signal.set_wakeup_fd while distrain starts, and again during the script's fits "
       "(fit/stop_input.py)", "replaces", "process", "#67: a stop while TensorFlow imports is not lost; #84: a group "
       "SIGTERM ended a PyDataset's pool workers and the main thread, held in C++, waited for their batch for ever",
       ("signal:set_wakeup_fd",), "python"),
    _p("stalls.stack_dump", "every thread's frame for a stuck rank's report", "reads", "call",
       "a stuck rank is named with where it is stuck", ("sys:_current_frames",), "python"),
    _p("log.stdout_line_end", "the chief's sys.stdout, remembering whether the script's output stands mid-line",
       "wraps", "process", "#84: distrain's lines landed inside the script's progress bar", ("sys:stdout",),
       "python"),
)

BY_NAME = {p.name: p for p in PATCHES}
