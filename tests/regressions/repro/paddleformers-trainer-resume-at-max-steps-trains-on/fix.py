"""paddleformers-trainer: silent-corruption in P-RESUME (paddleformers-trainer-resume-at-max-steps-trains-on)

The candidate fix (paddleformers-resume-at-max-steps), written by ckpt-harness: ``bash run.sh --with-fix`` runs the
repro with it, repro.py calling ``apply()`` in every process before its first step. fix.diff is the same change as a
patch of the framework's source."""

import __future__

import contextlib
import hashlib
import importlib
import inspect
import linecache
import sys
import textwrap
import types
from collections.abc import Callable, Iterator

EDITS_ATTR = "__ckpt_fixes__"  # on a patched function: ((fix id, edits), ...) in the order they were applied
ORIGINAL_ATTR = "__ckpt_original__"  # ... and the framework's own function it replaces


def source_digest(text: str) -> str:
    """The first 16 hex digits of the sha256 of a function's source, as ``inspect.getsource`` gives it."""
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def target(module: str, qualname: str) -> tuple[object, str, Callable]:
    """Where the function is bound in its own module (the module or the class), its name, and the function."""
    owner: object = importlib.import_module(module)
    *path, name = qualname.split(".")
    for part in path:
        owner = getattr(owner, part)
    return owner, name, inspect.getattr_static(owner, name)


def compiled(original: Callable, source: str, owner: object, filename: str) -> Callable:
    """``source`` (the function's whole text) compiled in ``original``'s module globals, so it sees what the original
    sees. A method calling super() closes over its class: it is compiled inside a function that binds ``__class__``
    to ``owner``. It is compiled under the original's own ``__future__`` annotations, so annotations the module leaves
    unevaluated stay so. ``filename`` names it in tracebacks, which show its lines."""
    body = textwrap.indent(textwrap.dedent(source), "    ")
    factory = f"def __ckpt_factory__(__class__):\n{body}    return {original.__name__}\n"
    linecache.cache[filename] = (len(factory), None, factory.splitlines(True), filename)
    namespace: dict = {}
    lazy = original.__code__.co_flags & __future__.annotations.compiler_flag
    exec(compile(factory, filename, "exec", flags=lazy, dont_inherit=True), original.__globals__, namespace)
    func = namespace["__ckpt_factory__"](owner)
    func.__qualname__, func.__module__ = original.__qualname__, original.__module__
    return func


_pending: list | None = None  # inside batched(): the (old, new) pairs still to be bound beyond their owners


@contextlib.contextmanager
def batched() -> Iterator[None]:
    """Rebinds made inside take effect where each function is defined at once, and everywhere else in one scan of
    the loaded modules when the outermost block ends: with a framework loaded a scan costs tens of milliseconds,
    and a rank applies dozens of fixes."""
    global _pending
    if _pending is not None:
        yield
        return
    _pending = []
    try:
        yield
    finally:
        pending, _pending = _pending, None
        _rebind_all(pending)


def rebind(old: Callable, new: Callable, owner: object = None, name: str = "") -> None:
    """Every module attribute and class attribute that is ``old`` becomes ``new``; inside ``batched()``, where
    ``owner`` (the module or class defining it) holds it as ``name`` at once, and elsewhere when the block ends."""
    if _pending is None or owner is None:
        _rebind_all([(old, new)])
        return
    namespace = vars(owner) if isinstance(owner, types.ModuleType) else _ClassNamespace(owner)
    if namespace.get(name) is old:
        _set(namespace, name, new)
    _pending.append((old, new))


def _rebind_all(pairs: list) -> None:
    """One scan binding each ``old`` of ``pairs`` to the last function it was replaced by (a function patched
    twice in a batch goes from the original to the second version)."""
    final: dict[int, Callable] = {}
    for old, new in pairs:  # the pairs hold every old function alive, so ids stay unique meanwhile
        for key, value in final.items():
            if value is old:
                final[key] = new
        final[id(old)] = new
    for namespace in _namespaces():
        for name, value in list(namespace.items()):
            new = final.get(id(value))
            if new is not None and new is not value:
                _set(namespace, name, new)


def _namespaces() -> Iterator[dict]:
    """The dicts of every loaded module and of the classes defined in them."""
    for module in list(sys.modules.values()):
        if not isinstance(module, types.ModuleType):
            continue
        try:
            namespace = vars(module)
        except TypeError:
            continue
        yield namespace
        for value in list(namespace.values()):
            if isinstance(value, type) and getattr(value, "__module__", None) == module.__name__:
                yield _ClassNamespace(value)


class _ClassNamespace(dict):
    """A class's attributes, read as a dict and written through ``setattr`` (a mappingproxy is read-only)."""

    def __init__(self, cls: type) -> None:
        super().__init__(vars(cls))
        self.cls = cls


def _set(namespace: dict, name: str, value: object) -> None:
    if isinstance(namespace, _ClassNamespace):
        setattr(namespace.cls, name, value)
    else:
        namespace[name] = value


# (module, function, sha256[:16] of the source it was written against, the patched function)
PATCHES = [
    ('paddleformers.trainer.trainer', 'Trainer._inner_training_loop', '245af0232e0a0caf',
     r'''    def _inner_training_loop(
        self,
        args,
        model,
        train_dataloader,
        len_dataloader,
        max_steps,
        num_train_epochs,
        num_update_steps_per_epoch,
        num_train_samples,
        resume_from_checkpoint,
        ignore_keys_for_eval,
    ):
        start_time = time.time()
        self._globalstep_last_start_time = time.time()
        self.state.epoch = 0
        epochs_trained = 0
        steps_trained_in_current_epoch = 0
        consumed_samples = 0
        steps_trained_progress_bar = None

        # Check if continuing training from a checkpoint
        if (
            resume_from_checkpoint is not None
            and distributed_isfile(os.path.join(resume_from_checkpoint, TRAINER_STATE_NAME))
            and not self.args.ignore_load_lr_and_optim
        ):
            state_path = distributed_file(os.path.join(resume_from_checkpoint, TRAINER_STATE_NAME))
            # 根据文件扩展名判断使用哪种加载方法
            if state_path.endswith(".json"):
                self.state = TrainerState.load_from_json(state_path)
            else:
                self.state = TrainerState.load(state_path)
            if self.args.world_size > 1:
                global_step_list = []
                paddle.distributed.all_gather(
                    global_step_list, paddle.to_tensor([self.state.global_step], dtype="int64")
                )
                assert (
                    paddle.sum(paddle.stack(global_step_list) - global_step_list[0]) == 0
                ), f"Error, get different global step, please check! step list: {[x.item() for x in global_step_list]}"

            epochs_trained = self.state.global_step // num_update_steps_per_epoch
            if not args.ignore_data_skip:
                steps_trained_in_current_epoch = self.state.global_step % (num_update_steps_per_epoch)
                steps_trained_in_current_epoch *= args.gradient_accumulation_steps
            else:
                steps_trained_in_current_epoch = 0

            logger.info("  Continuing training from checkpoint, will skip to saved global_step")
            logger.info(f"  Continuing training from epoch {epochs_trained}")
            logger.info(f"  Continuing training from global step {self.state.global_step}")
            if not args.ignore_data_skip:
                logger.info(
                    f"  Will skip the first {epochs_trained} epochs then the first {steps_trained_in_current_epoch} "
                    "batches in the first epoch. If this takes a lot of time, you can add the `--ignore_data_skip` "
                    "flag to your launch command, but you will resume the training on data already seen by your model."
                )
                # tqdm of skip data progress
                if self.is_local_process_zero():
                    steps_trained_progress_bar = tqdm(total=steps_trained_in_current_epoch)
                    steps_trained_progress_bar.set_description("Skipping the first batches")
            if not args.ignore_data_skip:
                if isinstance(train_dataloader, paddle.io.DataLoader) and isinstance(
                    train_dataloader.batch_sampler,
                    (NlpDistributedBatchSampler, MappingBatchSampler, MappingDistributedBatchSampler),
                ):
                    consumed_samples = steps_trained_in_current_epoch * args.train_batch_size * args.dataset_world_size
                    train_dataloader.batch_sampler.set_epoch(consumed_samples=consumed_samples)
                    logger.info(f"Set Sampler consumed_samples to {consumed_samples}")

        epoch_iterator = train_dataloader
        # Use len_dataloader directly instead of len(epoch_iterator) to avoid
        # calling __len__ on IterableDataset which would raise an exception
        steps_in_epoch = (
            len_dataloader if len_dataloader is not None else args.max_steps * args.gradient_accumulation_steps
        )
        if len_dataloader is not None:
            if self.args.gradient_accumulation_steps > len_dataloader:
                logger.warning(
                    f"changing accumulation step from `{self.args.gradient_accumulation_steps}` to `{len_dataloader}` to avoid, cross epoch accumulate"
                )
                self.args.gradient_accumulation_steps = len_dataloader

        self.callback_handler.model = self.model
        self.callback_handler.optimizer = self.optimizer
        self.callback_handler.lr_scheduler = self.lr_scheduler
        self.callback_handler.train_dataloader = train_dataloader

        self.state.max_steps = int(max_steps)
        self.state.num_train_epochs = num_train_epochs
        self.state.is_local_process_zero = self.is_local_process_zero()
        self.state.is_world_process_zero = self.is_world_process_zero()
        self.state.consumed_samples = 0

        self.control = self.callback_handler.on_train_begin(args, self.state, self.control)

        tr_loss = paddle.to_tensor(0.0)
        self._total_loss_scalar = 0.0
        self._globalstep_last_logged = self.state.global_step

        if self.args.device == "npu" and self.args.flatten_param_grads:
            from .plugins.npu_plugin import npu_accelerate_plugin

            npu_accelerate_plugin(self.optimizer)

        if self.args.ignore_data_skip:
            self.timers and self.timers("read-data").start()

        if self.resume_from_custom_func is not None:
            self.resume_from_custom_func(model)

        # a job resumed at max_steps has no step left to take
        last_epoch = (num_train_epochs if self.state.global_step < self.state.max_steps
                      else epochs_trained)
        for epoch in range(epochs_trained, last_epoch):
            if (
                not args.enable_auto_parallel
                and isinstance(train_dataloader, paddle.io.DataLoader)
                and isinstance(train_dataloader.batch_sampler, (MappingBatchSampler, MappingDistributedBatchSampler))
            ):
                train_dataloader.batch_sampler.set_epoch(epoch, consumed_samples)

            step_control = 0  # used in loop control, reset to 0 after every step
            self.control = self.callback_handler.on_epoch_begin(args, self.state, self.control)

            step = -1

            # Data loading timing for global_step
            _data_load_time_for_global_step = 0.0
            _data_load_start_time = time.time()

            for step, inputs in enumerate(epoch_iterator):
                # Record data loading time for this iteration
                _data_load_end_time = time.time()
                _data_load_time_for_global_step += _data_load_end_time - _data_load_start_time

                if self.args.profile and step % self.args.gradient_accumulation_steps == 0:
                    perf_utils.switch_profile(
                        self.state.global_step,
                        self.args.profile_step_start,
                        self.args.profile_step_end,
                        enable_layerwise_event=True,
                    )
                os.environ["TRAINER_GLOBAL_STEP"] = str(self.state.global_step)
                self.callback_handler.on_load_data_end(args, self.state, self.control, inputs=inputs)

                # Skip past any already trained steps if resuming training
                # for paddleformers.utils.batch_sampler.(NlpDistributedBatchSampler & MappingBatchSampler & MappingDistributedBatchSampler)
                # We use consumed_samples to reset the status
                dataloader = train_dataloader
                if self.args.enable_auto_parallel:
                    dataloader = train_dataloader._dataloader

                if isinstance(dataloader, paddle.io.DataLoader) and isinstance(
                    dataloader.batch_sampler,
                    (NlpDistributedBatchSampler, MappingBatchSampler, MappingDistributedBatchSampler),
                ):
                    if step == 0:
                        if steps_trained_progress_bar is not None:
                            steps_trained_progress_bar.update(steps_trained_in_current_epoch)
                            steps_trained_progress_bar.close()
                            steps_trained_progress_bar = None
                        self._load_rng_state(resume_from_checkpoint)
                    step += steps_trained_in_current_epoch
                elif steps_trained_in_current_epoch > 0:
                    steps_trained_in_current_epoch -= 1
                    if steps_trained_progress_bar is not None:
                        steps_trained_progress_bar.update(1)
                    if steps_trained_in_current_epoch == 0:
                        self._load_rng_state(resume_from_checkpoint)
                    self.timers and self.timers("read-data").start()
                    # Reset data loading timer for skipped steps
                    _data_load_start_time = time.time()
                    continue
                elif steps_trained_progress_bar is not None:
                    steps_trained_progress_bar.close()
                    steps_trained_progress_bar = None

                inputs_list = self._get_inputs_list(inputs)

                if not self.args.enable_auto_parallel and should_skip_data(
                    self.state.global_step, self.args.skip_data_intervals
                ):
                    # skip this step

                    if (step_control + 1) % self.args.gradient_accumulation_steps == 0 or (
                        # last step in epoch but step is always smaller than gradient_accumulation_steps
                        steps_in_epoch <= args.gradient_accumulation_steps
                        and (step + 1) == steps_in_epoch
                    ):
                        # update current global step and skip step
                        self.state.global_step += 1
                        self._skip_global_steps += 1
                        self._skip_steps_since_last_logged += 1

                        self.state.epoch = epoch + (step + 1) / steps_in_epoch

                        # For ZCC EMA
                        if self.args.enable_zero_cost_checkpoint or self.args.zcc_save_ema_coef is not None:
                            tr_loss_for_zcc = tr_loss.clone()
                            dist.all_reduce(
                                tr_loss_for_zcc, dist.ReduceOp.SUM
                            )  # 3级并行时，每个pp下的loss会广播，全局reduce-mean的时候，分子分母都会乘以pp_world_size，结果会被约掉
                            tr_loss_for_zcc_scalar = tr_loss_for_zcc.item() / dist.get_world_size()
                            self.state.loss = tr_loss_for_zcc_scalar

                        self.state.consumed_samples = (
                            self.state.global_step
                            * args.per_device_train_batch_size
                            * args.gradient_accumulation_steps
                            * args.dataset_world_size
                        )

                        if self.state.global_step == 1 and self.args.logging_first_step:
                            self.control.should_log = True
                        if (
                            self.args.logging_strategy == IntervalStrategy.STEPS
                            and self.state.global_step % self.args.logging_steps == 0
                        ):
                            self.control.should_log = True

                        self.control.should_evaluate = False
                        self.control.should_save = False

                        # log loss and memory usage
                        self._maybe_log_save_evaluate(tr_loss, model, epoch, ignore_keys_for_eval, inputs=inputs)
                        self._print_timer()
                        step_control = 0
                    else:
                        step_control += 1
                    if self.state.global_step >= self.state.max_steps:
                        break

                    self.timers and self.timers("read-data").start()
                    # Reset data loading timer for skipped data
                    _data_load_time_for_global_step = 0.0
                    _data_load_start_time = time.time()
                    continue

                for inputs in inputs_list:
                    if step_control % args.gradient_accumulation_steps == 0:
                        self.control = self.callback_handler.on_step_begin(args, self.state, self.control)
                        self.timers and self.timers("forward-backward").start()

                    sync_context = None
                    if not self.args.enable_auto_parallel:
                        # stage2 and stage3 should not no_sync, because the is no DDP wrapper and no_sync API
                        # hybrid_parallel (tp or pp or sharding stage 1) should not no_sync
                        available_no_sync = hasattr(model, "no_sync")
                        is_no_sync = (
                            (
                                ((step_control + 1) % args.gradient_accumulation_steps != 0)
                                and args._no_sync_in_gradient_accumulation
                            )
                            or args.recompute_granularity is not None
                            or args.use_expert_parallel
                        ) and available_no_sync
                        # sharding
                        # stage1. the same as ddp
                        # stage2. manually collect gradient on dp group

                        dp_master_grad = (
                            self.args.world_size > 1
                            and self.args.amp_master_grad
                            and not self.args.use_hybrid_parallel
                        )
                        if dp_master_grad:
                            is_no_sync = True

                        sync_context = model.no_sync() if is_no_sync else contextlib.nullcontext()
                        if self.args.count_trained_tokens:
                            self.trained_effective_tokens += (inputs["input_ids"] != self.args.pad_token_id).sum()
                            self.trained_tokens += inputs["input_ids"].numel()

                    if not self.args.enable_auto_parallel:
                        with sync_context:
                            if "step_control" in inspect.signature(self.training_step).parameters:
                                tr_loss_step = self.training_step(model, inputs, step_control=step_control)
                            else:
                                tr_loss_step = self.training_step(model, inputs)
                    else:
                        tr_loss_step = self.training_step(model, inputs)

                    if self.args.enable_auto_parallel:
                        with _exec_mode_guard("dynamic"):
                            tr_loss += tr_loss_step
                    else:
                        tr_loss += tr_loss_step

                    def fused_allreduce_gradients_no_sync(paramlist, hcg):
                        paramlist = list(paramlist)
                        nonmoe_list = [p for p in paramlist if not getattr(p, "no_sync", False)]
                        moelist = [p for p in paramlist if getattr(p, "no_sync", False)]
                        if moelist and not self.args.use_expert_parallel:
                            logger.warning("found `no sync` param when `use_expert_parallel=False`")
                        fused_allreduce_gradients(nonmoe_list, hcg)

                    def hybrid_parallel_scale_param_grad(paramlist, hcg):
                        if not hasattr(hcg, "get_context_parallel_world_size"):
                            cp_worldsize = 1
                        else:
                            cp_worldsize = hcg.get_context_parallel_world_size()

                        for p in paramlist:
                            color = getattr(p, "color", -1)
                            is_expert = isinstance(color, dict) and color.get("color", -1) == "moe_expert"
                            disable_scale_grad = getattr(p, "context_parallel_disable_scale_grad", False)
                            if not (disable_scale_grad or is_expert) and cp_worldsize > 1:
                                grad = getattr(p, "main_grad", p.grad)
                                if grad is not None:
                                    with paddle.no_grad():
                                        coeff = cp_worldsize
                                        grad.scale_(coeff)
                            elif is_expert and self.args.hybrid_parallel_expert_grad_scale != 1.0:
                                grad = getattr(p, "main_grad", p.grad)
                                if grad is not None:
                                    with paddle.no_grad():
                                        coeff = self.args.hybrid_parallel_expert_grad_scale
                                        grad.scale_(coeff)

                    disable_accumulation = False

                    if (step_control + 1) % args.gradient_accumulation_steps == 0 or (
                        # last step in epoch but step is always smaller than gradient_accumulation_steps
                        steps_in_epoch <= args.gradient_accumulation_steps
                        and (step + 1) == steps_in_epoch
                        or disable_accumulation
                    ):
                        # assert if loss is invalid
                        self._check_loss_valid(tr_loss)

                        self.timers and self.timers("forward-backward").stop()

                        parameters_list = None
                        if not args.enable_auto_parallel:
                            # Manually collect gradients
                            # Case 1: Use recompute and dp
                            # Case 2: Hack dp with master_grad
                            # Case 3: Pipeline or sharding overlap
                            # local_rank != -1 don't means dp in networks.
                            self.timers and self.timers("all-reduce").start()
                            if hasattr(self.optimizer, "_hcg"):
                                hybrid_parallel_scale_param_grad(list(model.parameters()), self.optimizer._hcg)

                            # Case 1: Use recompute and dp / sharding stage1,
                            # manually collect gradient for dp.
                            if (
                                args.recompute_granularity is not None or args.use_expert_parallel
                            ) and available_no_sync:
                                fused_allreduce_gradients_no_sync(list(model.parameters()), None)

                            # Case 2: hack dp with master_grad
                            elif dp_master_grad:
                                fused_allreduce_gradients_no_sync(list(model.parameters()), None)

                            # Pipeline parallel mode,  handle gradient reduce here to overlap
                            enable_dp_comm_overlap = (
                                self.args.pipeline_model_parallel_size > 1 and args.dp_comm_overlap
                            )

                            enable_release_grads = False
                            if args.sharding_parallel_size > 1:
                                enable_release_grads = args.sd_release_grads
                            if not enable_release_grads and args.pipeline_model_parallel_size > 1:
                                enable_release_grads = args.pp_release_grads

                            # Case 3: Pipeline parallel mode, overlap with dp
                            if isinstance(self.optimizer, HybridParallelOptimizer) and not self.do_grad_scaling:
                                parameters_list = _obtain_optimizer_parameters_list(self.optimizer._inner_opt)

                                if not enable_dp_comm_overlap:
                                    if self.optimizer._sharding_enable:
                                        assert reshard_util.is_sharding_opt(self.optimizer)
                                        self.optimizer._inner_opt.reduce_gradients(
                                            list(parameters_list), self.optimizer._hcg
                                        )

                                    if self.optimizer._dp_enable or getattr(self.optimizer, "_sep_enable", False):
                                        fused_allreduce_gradients_no_sync(list(parameters_list), self.optimizer._hcg)
                            self.timers and self.timers("all-reduce").stop()
                            self.timers and self.timers("optimizer-step").start()

                        if not args.enable_auto_parallel and self.args.gradient_accumulation_steps > 1:
                            paddle.device.synchronize()
                            parameters = (
                                model._layers.parameters() if hasattr(model, "_layers") else model.parameters()
                            )
                            for p in parameters:
                                with paddle.no_grad():
                                    if hasattr(p, "main_grad") and p.main_grad is not None:
                                        assert p.grad is None
                                        p.main_grad.scale_(1.0 / self.args.gradient_accumulation_steps)
                                    elif p.grad is not None:
                                        p.grad.scale_(1.0 / self.args.gradient_accumulation_steps)
                        # Optimizer step
                        self.callback_handler.on_optimizer_begin(
                            args, self.state, self.control, scaler=self.scaler if self.do_grad_scaling else None
                        )
                        self.optimizer_step(args, model=model, parameters_list=parameters_list)

                        if not args.enable_auto_parallel:
                            self.timers and self.timers("optimizer-step").stop()

                        self.callback_handler.on_optimizer_end(
                            args, self.state, self.control, scaler=self.scaler if self.do_grad_scaling else None
                        )

                        self.state.global_step += 1
                        self.state.epoch = epoch + (step + 1) / steps_in_epoch
                        self.state.consumed_samples = (
                            self.state.global_step
                            * args.per_device_train_batch_size
                            * args.gradient_accumulation_steps
                            * args.dataset_world_size
                        )
                        # For ZCC EMA
                        if self.args.enable_zero_cost_checkpoint or self.args.zcc_save_ema_coef is not None:
                            tr_loss_for_zcc = tr_loss.clone()
                            dist.all_reduce(
                                tr_loss_for_zcc, dist.ReduceOp.SUM
                            )  # 3级并行时，每个pp下的loss会广播，全局reduce-mean的时候，分子分母都会乘以pp_world_size，结果会被约掉
                            tr_loss_for_zcc_scalar = tr_loss_for_zcc.item() / dist.get_world_size()
                            self.state.loss = tr_loss_for_zcc_scalar

                        self.control = self.callback_handler.on_step_end(args, self.state, self.control)
                        self._maybe_log_save_evaluate(tr_loss, model, epoch, ignore_keys_for_eval, inputs=inputs)
                        # Log data loading time for this global_step
                        logger.info(
                            f"[DataLoad global_step: {self.state.global_step}] "
                            f"data_load_time: {_data_load_time_for_global_step * 1000:.2f} ms "
                            f"(accumulated over {args.gradient_accumulation_steps} micro-batches)"
                        )
                        self._print_timer()
                        # Reset data loading timer for next global_step
                        _data_load_time_for_global_step = 0.0
                        step_control = 0
                    else:
                        self.control = self.callback_handler.on_substep_end(args, self.state, self.control)
                        step_control += 1

                if self.control.should_epoch_stop or self.control.should_training_stop:
                    break

                if self.args.ignore_data_skip:
                    self.timers and self.timers("read-data").start()

                # Reset start time for next iteration's data loading measurement
                _data_load_start_time = time.time()

            if step < 0:
                logger.warning(
                    f"There seems to be not a single sample in your epoch_iterator, stopping training at step"
                    f" {self.state.global_step}! This is expected if you're using an IterableDataset and set"
                    f" num_steps ({self.state.max_steps}) higher than the number of available samples."
                )
                self.control.should_training_stop = True

            self.control = self.callback_handler.on_epoch_end(args, self.state, self.control)

            if self.args.enable_auto_parallel:
                with _exec_mode_guard("dynamic"):
                    self._maybe_log_save_evaluate(tr_loss, model, epoch, ignore_keys_for_eval, inputs=inputs)
            else:
                self._maybe_log_save_evaluate(tr_loss, model, epoch, ignore_keys_for_eval, inputs=inputs)

            if self.control.should_training_stop:
                break

            consumed_samples = 0

        if args.past_index and hasattr(self, "_past"):
            # Clean the state at the end of training
            delattr(self, "_past")

        if not self.args.enable_auto_parallel and self.args.enable_zero_cost_checkpoint:
            self.zcc_manager.finalize()
        logger.info("\nTraining completed. \n")

        if not self.args.enable_auto_parallel:
            # unlink shared_memory if used.
            if (
                self.args.save_checkpoint_format == "unified_checkpoint"
                or self.args.load_checkpoint_format == "unified_checkpoint"
            ):
                self.unified_checkpoint_handler.unlink_shared_memory()

            if args.load_best_model_at_end and self.state.best_model_checkpoint is not None:
                if args.local_rank != -1:
                    dist.barrier()

                logger.info(
                    f"Loading best model from {self.state.best_model_checkpoint} (score: {self.state.best_metric})."
                )
                if isinstance(self.model, LoRAModel):
                    self._load_best_model_from_peft_checkpoint()
                else:
                    if self.args.load_checkpoint_format == "unified_checkpoint":
                        self.unified_checkpoint_handler.load_unified_checkpoint(
                            self.model,
                            self.state.best_model_checkpoint,
                            convert_from_hf=self.args.convert_from_hf,
                        )
                        if self.args.sharding_parallel_size > 1 or self.args.data_parallel_size > 1:
                            broadcast_dataset_rank0_model(self.model)
                    else:
                        weight_name = PADDLE_WEIGHTS_NAME
                        best_model_path = os.path.join(
                            self.state.best_model_checkpoint, _add_variant(weight_name, self.args.weight_name_suffix)
                        )
                        if os.path.exists(best_model_path):
                            # We load the model state dict on the CPU to avoid an OOM error.
                            state_dict = paddle.load(best_model_path, return_numpy=True)
                            # If the model is on the GPU, it still works!
                            self._set_state_dict_in_model(state_dict)
                        else:
                            logger.warning(
                                f"Could not locate the best model at {best_model_path}, if you are running a distributed training "
                                "on multiple nodes, you should activate `--save_on_each_node`."
                            )

        self._total_loss_scalar += self._get_item_from_loss(tr_loss)

        # In case all steps were skipped, the total loss is set to 0.
        if self.state.global_step == self._skip_global_steps:
            logger.info("All steps were skipped, the total loss is set to 0.")
            train_loss = 0.0
        else:
            train_loss = self._total_loss_scalar / (self.state.global_step - self._skip_global_steps)

        metrics = speed_metrics("train", start_time, num_samples=num_train_samples, num_steps=self.state.max_steps)

        metrics["train_loss"] = train_loss

        self.is_in_train = False

        self._memory_tracker.stop_and_update_metrics(metrics)

        self.log(metrics)

        kwargs = {
            "metrics_dumper": self.metrics_dumper,
        }
        self.control = self.callback_handler.on_train_end(args, self.state, self.control, **kwargs)

        return TrainOutput(self.state.global_step, train_loss, metrics)
'''),
]


_APPLIED = []


def apply():
    """Bind every patched function where the framework holds the original (once per process). A stale fix (the
    installed framework's source is not what it was written against) stops the run with status 3 and says so."""
    if _APPLIED:
        return
    for module, qualname, digest, source in PATCHES:
        owner, _, original = target(module, qualname)
        found = source_digest(inspect.getsource(original))
        if found != digest:
            print(f"STALE FIX: {module}.{qualname} is not the source this fix was written against (sha256 {found}, "
                  f"expected {digest}): the installed framework changed there", flush=True)
            sys.exit(3)
        rebind(original, compiled(original, source, owner, f"<fix.py: {module}.{qualname}>"))
    _APPLIED.append(True)
