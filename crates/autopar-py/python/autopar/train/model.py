"""``Model``: MindSpore's training loop over autopar's engine.

``train`` compiles the loss network once (its ``construct`` traced with the first batch's
shapes), plans it under the parallel context and starts its ranks: ``device_num`` simulated
devices as threads of this process. Each step feeds the job its global batch (every rank's
batch of the dataset joined, or with ``full_batch`` the dataset's batch as it is); callbacks
run between steps on rank 0's view. The parameters return to the network's ``Parameter``
objects after training (and when ``ModelCheckpoint`` saves)."""

import numpy as np

from .. import _context, _native
from .._trace import Tracer, unwire, wire
from ..common.tensor import Tensor
from ..nn.cell import Cell, _name_children
from ..nn.optim import Optimizer, _Scheduled
from ..amp import FixedLossScaleManager, LossScaleManager
from ..nn.wrap import TrainOneStepCell, WithLossCell
from ..dataset import join_shards
from ._callback import RunContext, _Params

__all__ = ["Model"]


class _Running:
    """What a compiled job running on its devices shares with the script's Parameters: values
    set since its last step go to the ranks (``_push_changed``); the ranks' newer values come
    back on demand (``mark_stale``, then ``pull`` when a Parameter is read). ``params`` and
    ``versions`` (each Parameter's version the ranks hold) are set by the job, and
    ``optimizer`` (the optimizer its ranks apply), whose state ``load_param_into_net`` gave
    goes to the ranks before their next step, and comes back for checkpoints
    (``optimizer_checkpoint``)."""

    optimizer = None
    # Whether the optimizer's pending state goes to the ranks with the parameters (a function's
    # job takes it at the update, once it is the optimizer's home).
    _state_with_params = True

    def _push_changed(self):
        takes = self._state_with_params and self.optimizer is not None
        pending = self.optimizer.__dict__.pop("_pending_state", None) if takes else None
        if pending is not None:
            self._load_optimizer_state(*pending)
        for p in self.params:
            if p.__dict__.get("_stale", self) is not self:
                p.asnumpy()  # another job's newer value
        changed = [p for p in self.params if p._version != self.versions[id(p)]]
        if changed:
            self.session.load([wire(p.name, p._data) for p in changed])
            self.versions.update({id(p): p._version for p in changed})

    def pull(self):
        """The ranks' parameters back into the network's Parameters (those not set since)."""
        values = dict(unwire(e) for e in self.session.params())
        for p in self.params:
            if p.__dict__.get("_stale", self) is not self or p._version != self.versions[id(p)]:
                continue  # set by the user since the job last had it: the job takes it at its next step
            p.__dict__.pop("_stale", None)
            if p.name in values:
                p._set_from_job(values[p.name])
            self.versions[id(p)] = p._version

    def _engine_keys(self):
        """MindSpore's state prefix of each of the engine's (``moment1.`` for ``adam_m.``)."""
        return dict(zip(self.session.optimizer_prefixes(), self.optimizer._state_prefixes))

    def _load_optimizer_state(self, state, steps):
        engine = {ms: e for e, ms in self._engine_keys().items()}
        wires = []
        for key, value in state.items():
            prefix = next((ms for ms in engine if key.startswith(ms)), None)
            if prefix is not None:
                wires.append(wire(engine[prefix] + key[len(prefix):], value))
        self.session.load_optimizer_state(wires, steps)  # steps None: the optimizer keeps its count

    def optimizer_checkpoint(self):
        """The optimizer's entries of a MindSpore checkpoint: its state (MindSpore's names,
        ``moments.w``), ``global_step``, ``learning_rate`` and the optimizer's own scalars."""
        if self.optimizer is None:
            return {}
        state, steps = self.session.optimizer_state()
        names = self._engine_keys()
        out = {}
        for entry in state:
            key, value = unwire(entry)
            prefix = next((e for e in names if key.startswith(e)), None)
            if prefix is not None:
                out[names[prefix] + key[len(prefix):]] = value
        out.update(self.optimizer._checkpoint_extra(steps))
        return out

    def mark_stale(self):
        """The ranks hold newer values than the Parameters: read on demand (``asnumpy``)."""
        for p in self.params:
            if p._version == self.versions[id(p)]:
                p.__dict__["_stale"] = self


class _Job(_Running):
    """A compiled train network running on its devices."""

    def __init__(self, train_network, optimizer, columns, batch, loss_scale=None, amp=(None, None)):
        from ..nn.wrap import _MicroBatches

        micro = [c.micro_size for _, c in train_network.cells_and_names() if isinstance(c, _MicroBatches)]
        if len(micro) > 1:
            raise ValueError("The train network holds more than one PipelineCell / GradAccumulationCell: give one micro_size.")
        self.micro = micro[0] if micro else None
        if self.micro:
            # The network is compiled for one micro-batch; the job takes the batch in micro_size parts.
            rows = len(batch[0])
            if rows % self.micro:
                raise ValueError(f"A batch of {rows} rows cannot be cut into micro_size={self.micro} micro-batches of equal rows.")
            self.full_shapes = [tuple(a.shape) for a in batch]
            batch = [a[: rows // self.micro] for a in batch]
        tracer = Tracer()
        trainable = {id(p) for p in optimizer.parameters}
        _name_children(train_network)
        with tracer.tracing():
            inputs = [tracer.input(name, array) for name, array in zip(columns, batch)]
            for p in train_network.get_parameters():
                if p.requires_grad and id(p) not in trainable:
                    p.__dict__["_frozen_here"] = True
            try:
                loss = train_network(*inputs)
            finally:
                for p in train_network.get_parameters():
                    p.__dict__.pop("_frozen_here", None)
        if isinstance(loss, (tuple, list)):
            loss = loss[0]
        if not isinstance(loss, Tensor) or not loss._is_traced():
            raise TypeError(f"The loss network {type(train_network).__name__} must return a tensor computed from its inputs, but returned {loss!r}.")
        self.loss_elements = max(loss.size, 1)
        self.params = [p for _, p in tracer.params.values()]
        wires = [wire(p.name, p.asnumpy()) for p in self.params] + [wire(n, a) for n, a in tracer.consts]
        self.shapes = self.full_shapes if self.micro else [tuple(a.shape) for a in batch]
        self.columns = list(columns)
        for p in self.params:
            if p.layerwise_parallel:
                raise NotImplementedError(
                    f"Parameter {p.name} is layerwise_parallel: autopar's front end plans the whole network (hybrid_parallel's "
                    "rank-by-rank networks are built with the Rust API)."
                )
        self.optimizer = optimizer
        self.session = _native.Session(tracer.network, loss._node, _context._job_context(), wires, optimizer._kind,
                                       optimizer.learning_rate, optimizer.hyper, optimizer._groups_wire(), optimizer._state_prefixes,
                                       self.micro, loss_scale, *amp)
        self.versions = {id(p): p._version for p in self.params}
        self.layouts = {k: list(v) for k, v in self.session.layouts().items() if k not in self.columns}
        # A schedule cell's rates carry on with their last; a list given per step must cover the run.
        lists = [len(lr) for lr in [optimizer.learning_rate] + [lr for _, lr, _ in optimizer.groups if lr]
                 if len(lr) > 1 and not isinstance(lr, _Scheduled)]
        self.lr_steps, self.steps = (min(lists) if lists else None), 0

    def step(self, batch):
        if self.lr_steps is not None and self.steps >= self.lr_steps:
            raise RuntimeError(
                f"The optimizer's learning rate is a list of {self.lr_steps} steps, and this is step {self.steps + 1}: "
                "give a learning rate for every step of the run."
            )
        self.steps += 1
        shapes = [tuple(a.shape) for a in batch]
        if shapes != self.shapes:
            raise ValueError(
                f"A batch has shapes {shapes}, but the network was compiled for {self.shapes}: autopar compiles once per "
                "Model; give every batch the same shape (batch(..., drop_remainder=True))."
            )
        self._push_changed()
        return self.session.step([wire(n, a) for n, a in zip(self.columns, batch)])


class _Predictor(_Running):
    """A network compiled for inference on inputs of given shapes, running on its devices (in
    the precision ``amp``, the engine's (level, half type) names, as ``Model``'s)."""

    def __init__(self, network, names, arrays, amp=(None, None)):
        # A pipeline's inference runs one micro-batch per stage: the network is compiled for one.
        stages = int(_context._PARALLEL.get("pipeline_stages", 1) or 1)
        if stages > 1 and arrays:
            rows = len(arrays[0])
            if rows % stages:
                raise ValueError(f"An input of {rows} rows cannot be cut into the {stages} micro-batches of {stages} pipeline stages.")
            arrays = [a[: rows // stages] for a in arrays]
        tracer = Tracer()
        _name_children(network)
        with tracer.tracing():
            inputs = [tracer.input(name, array) for name, array in zip(names, arrays)]
            out = network(*inputs)
        self.single = not isinstance(out, (tuple, list))
        outs = [out] if self.single else list(out)
        for o in outs:
            if not isinstance(o, Tensor) or not o._is_traced():
                raise TypeError(f"{type(network).__name__}.construct must return tensors computed from its inputs, but returned {o!r}.")
        self.params = [p for _, p in tracer.params.values()]
        wires = [wire(p.name, p.asnumpy()) for p in self.params] + [wire(n, a) for n, a in tracer.consts]
        self.names = list(names)
        self.session = _native.Session.inference(tracer.network, [o._node for o in outs], _context._job_context(), wires, *amp)
        self.versions = {id(p): p._version for p in self.params}
        self.layouts = {k: list(v) for k, v in self.session.layouts().items() if k not in self.names}

    def __call__(self, arrays):
        self._push_changed()  # a training job's newer values, and the script's
        outs = [unwire(e)[1] for e in self.session.predict([wire(n, a) for n, a in zip(self.names, arrays)])]
        return outs


def _as_arrays(data):
    return [np.asarray(d.asnumpy() if isinstance(d, Tensor) else d) for d in data]


def predictor_for(network, arrays, names=None, amp=(None, None)):
    """``network`` compiled for inference on inputs like ``arrays``: once per input shapes, the
    parallel context, the train flag and the precision, kept on the cell."""
    names = names or [f"input{i}" for i in range(len(arrays))]
    key = (tuple(names), tuple((a.shape, str(a.dtype)) for a in arrays), _context._job_context(), network.training, tuple(amp))
    cache = network.__dict__.setdefault("_predictors", {})
    predictor = cache.get(key)
    if predictor is None:
        predictor = cache[key] = _Predictor(network, names, arrays, amp)
        network._parameter_layout_dict.update(predictor.layouts)
    return predictor


def train_step(cell, data):
    """One training step of a ``TrainOneStepCell`` called on values: compiled into a training
    job once (kept on the cell), the step's loss returned; the parameters are read back when
    asked for."""
    from .._functional import job_arrays

    # A tensor of a dataset sharded over the job's devices: the global batch, every rank's rows.
    arrays = job_arrays(data)
    job = cell.__dict__.get("_job")
    if job is None:
        names = [f"input{i}" for i in range(len(arrays))]
        job = cell.__dict__["_job"] = _Job(cell, cell.optimizer, names, arrays)
        cell._parameter_layout_dict.update(job.layouts)
    loss = job.step(arrays)
    job.mark_stale()
    return Tensor(np.array(loss / job.loss_elements, dtype=np.float32))


def run_network(network, data, names=None, amp=(None, None)):
    """The outputs of ``network`` on ``data`` (arrays or Tensors), run on the parallel
    context's devices (in the precision ``amp``)."""
    arrays = _as_arrays(data)
    predictor = predictor_for(network, arrays, names, amp)
    return predictor, predictor(arrays)


class _LossAndOutputs(Cell):
    """What ``Model.eval`` computes: the loss and the network's outputs (the labels it has)."""

    def __init__(self, network, loss_fn):
        super().__init__(auto_prefix=False)
        self._network = network
        self._loss_fn = loss_fn

    def construct(self, data, label):
        outputs = self._network(data)
        return self._loss_fn(outputs, label), outputs


def _amp(level, kwargs):
    """``amp_level`` with ``keep_batchnorm_fp32`` and ``cast_model_type`` checked: the engine's
    (level, half-precision type) names, as ``autopar train --amp-level --amp-dtype`` takes them."""
    from ..common import dtype as mstype

    level = "O0" if level is None else level
    if level not in ("O0", "O1", "O2", "O3"):
        raise ValueError(f"For 'Model', 'amp_level' must be one of 'O0', 'O1', 'O2', 'O3', but got {level!r} (autopar has no 'auto' level).")
    cast = kwargs.get("cast_model_type", mstype.float16)
    if cast not in (mstype.float16, mstype.bfloat16):
        raise ValueError(f"For 'Model', 'cast_model_type' must be float16 or bfloat16, but got {cast!r}.")
    keep = kwargs.get("keep_batchnorm_fp32")
    # MindSpore's O2 keeps BatchNorm in float32, O3 does not: autopar's levels are those.
    if keep is not None and level in ("O2", "O3") and bool(keep) != (level == "O2"):
        raise NotImplementedError(
            f"For 'Model', amp_level={level!r} with keep_batchnorm_fp32={keep}: autopar's O2 keeps normalisations in float32 and "
            "its O3 does not; choose the level that does what you want."
        )
    if level == "O0":
        return (None, None)
    return (level, "bf16" if cast == mstype.bfloat16 else "f16")


def _loss_scale_manager(manager, optimizer):
    """The manager ``Model`` was given, checked against the optimizer's ``loss_scale``."""
    opt_scale = getattr(optimizer, "loss_scale", 1.0)
    if manager is None:
        if opt_scale != 1.0:
            raise NotImplementedError(
                f"For 'Model', the optimizer's loss_scale={opt_scale} divides gradients that nothing scaled: give "
                "loss_scale_manager=FixedLossScaleManager(loss_scale, drop_overflow_update=False) with it, or leave it at 1.0."
            )
        return None
    if not isinstance(manager, LossScaleManager) or type(manager) is LossScaleManager:
        raise TypeError(f"For 'Model', 'loss_scale_manager' must be a FixedLossScaleManager or a DynamicLossScaleManager, but got {type(manager)}.")
    keeps = isinstance(manager, FixedLossScaleManager) and not manager.get_drop_overflow_update()
    if keeps and opt_scale != manager.get_loss_scale():
        raise ValueError(
            f"For 'Model', FixedLossScaleManager({manager.get_loss_scale()}, drop_overflow_update=False) needs the optimizer's "
            f"loss_scale to be the same value (it divides the gradients), but it is {opt_scale}."
        )
    if not keeps and opt_scale != 1.0:
        raise ValueError(
            f"For 'Model', with {type(manager).__name__} the gradients are unscaled before the update: the optimizer's "
            f"loss_scale must be 1.0, but it is {opt_scale}."
        )
    return manager


class Model:
    """MindSpore's ``Model(network, loss_fn=None, optimizer=None, metrics=None, ...)``."""

    def __init__(self, network, loss_fn=None, optimizer=None, metrics=None, eval_network=None, eval_indexes=None, amp_level="O0",
                 boost_level="O0", **kwargs):
        if not isinstance(network, Cell):
            raise TypeError(f"For 'Model', 'network' must be a Cell, but got {type(network)}.")
        self._amp = _amp(amp_level, kwargs)
        if optimizer is not None and not isinstance(optimizer, Optimizer):
            raise TypeError(f"For 'Model', 'optimizer' must be an optimizer of autopar.nn, but got {type(optimizer)}.")
        for key in kwargs:
            if key not in ("keep_batchnorm_fp32", "loss_scale_manager", "cast_model_type"):
                raise TypeError(f"For 'Model', unexpected keyword argument {key!r}.")
        if eval_network is not None or eval_indexes is not None:
            raise NotImplementedError("For 'Model', autopar evaluates the network with loss_fn (eval_network and eval_indexes must be None).")
        self._loss_scale_manager = _loss_scale_manager(kwargs.get("loss_scale_manager"), optimizer)
        self._network = network
        self._loss_fn = loss_fn
        self._optimizer = optimizer
        self._metrics = metrics
        if isinstance(network, TrainOneStepCell):
            self._train_network = network
            self._optimizer = network.optimizer
        elif optimizer is not None:
            loss_net = WithLossCell(network, loss_fn) if loss_fn is not None else network
            self._train_network = TrainOneStepCell(loss_net, optimizer)
        else:
            self._train_network = None
        self._job = None

    @property
    def train_network(self):
        return self._train_network

    @property
    def predict_network(self):
        return self._network

    def train(self, epoch, train_dataset, callbacks=None, dataset_sink_mode=False, sink_size=-1, initial_epoch=0, valid_dataset=None,
              valid_frequency=1, valid_dataset_sink_mode=True):
        """Trains ``epoch`` epochs of ``train_dataset`` (MindSpore's CPU behaviour: callbacks
        every step, ``dataset_sink_mode`` accepted)."""
        if self._train_network is None:
            raise RuntimeError("For 'Model.train', the Model needs an optimizer (Model(network, loss_fn, optimizer)).")
        if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 1:
            raise ValueError(f"For 'Model.train', 'epoch' must be a positive int, but got {epoch!r}.")
        if not isinstance(initial_epoch, int) or not 0 <= initial_epoch < epoch:
            raise ValueError(f"For 'Model.train', 'initial_epoch' must be in [0, {epoch}), but got {initial_epoch!r}.")
        if valid_dataset is not None:
            raise NotImplementedError("For 'Model.train', autopar has no evaluation during training yet (valid_dataset must be None).")
        callbacks = list(callbacks) if isinstance(callbacks, (list, tuple)) else ([callbacks] if callbacks is not None else [])
        n = _context._device_num()
        full_batch = bool(_context._PARALLEL.get("full_batch", False))
        sharded = train_dataset._shards() is not None
        steps = train_dataset._size(0 if sharded else None)
        cb = _Params()
        cb.train_network, cb.network, cb.optimizer = self._train_network, self._network, self._optimizer
        cb.epoch_num, cb.batch_num, cb.cur_epoch_num, cb.cur_step_num = epoch, steps, initial_epoch, initial_epoch * steps
        if dataset_sink_mode and sink_size > 0:
            # MindSpore's CPU behaviour: whole epochs, the callbacks counting steps in sinks.
            cb.batch_num = sink_size
        cb.train_dataset, cb.mode, cb.device_number = train_dataset, "train", n
        cb.parallel_mode = _context.get_auto_parallel_context("parallel_mode")
        cb.net_outputs = None
        cb.loss_fn, cb.dataset_sink_mode, cb.list_callback = self._loss_fn, dataset_sink_mode, callbacks
        cb._sync_params = self._pull
        cb._optimizer_checkpoint = lambda: self._job.optimizer_checkpoint() if self._job is not None else {}
        run = RunContext(cb)
        for c in callbacks:
            c.on_train_begin(run)
        columns = train_dataset.get_col_names()
        self._check_data(train_dataset, n, full_batch, sharded)
        try:
            for e in range(initial_epoch, epoch):
                cb.cur_epoch_num = e + 1
                for c in callbacks:
                    c.on_train_epoch_begin(run)
                for batch in self._global_batches(train_dataset, e, n, full_batch):
                    cb.cur_step_num += 1
                    for c in callbacks:
                        c.on_train_step_begin(run)
                    if self._job is None:
                        # Model.train trains in training mode, as MindSpore's does.
                        self._train_network.set_train(True)
                        form = self._loss_scale_manager._engine_form() if self._loss_scale_manager else None
                        self._job = _Job(self._train_network, self._optimizer, columns, batch, form, self._amp)
                        self._train_network._parameter_layout_dict.update(self._job.layouts)
                        self._network._parameter_layout_dict.update(self._job.layouts)
                    loss = self._job.step(batch)
                    self._job.mark_stale()
                    cb.net_outputs = Tensor(np.array(loss / self._job.loss_elements, dtype=np.float32))
                    scaled = self._job.session.loss_scale()
                    if scaled is not None and self._loss_scale_manager.get_drop_overflow_update():
                        # MindSpore's TrainOneStepWithLossScaleCell returns (loss, overflow, scale).
                        scale, overflow, following = scaled
                        with np.errstate(over="ignore"):  # a scale past float32's range is infinite there
                            scale = np.array(scale, dtype=np.float32)
                        cb.net_outputs = (cb.net_outputs, Tensor(np.array(overflow)), Tensor(scale))
                        self._loss_scale_manager._loss_scale = following
                    for c in callbacks:
                        c.on_train_step_end(run)
                    if run.get_stop_requested():
                        break
                for c in callbacks:
                    c.on_train_epoch_end(run)
                if run.get_stop_requested():
                    break
        except BaseException:
            # The parameters the ranks reached, where they can still give them.
            try:
                self._pull()
            except RuntimeError:
                pass
            raise
        self._pull()
        for c in callbacks:
            c.on_train_end(run)

    def _check_data(self, dataset, n, full_batch, sharded):
        """Refuses, before any step, data the job would not read as MindSpore's ranks do."""
        import inspect

        shards = dataset._shards()
        if n > 1 and not full_batch and sharded and shards != n:
            raise ValueError(
                f"The dataset is cut into num_shards={shards}, but the job has {n} devices, each reading its own shard: "
                "give num_shards=get_group_size() and shard_id=get_rank(), or set full_batch=True."
            )
        short = dataset._short_batch(0 if sharded else None)
        if short:
            raise ValueError(
                f"The last batch of each epoch has {short} rows, fewer than the others: autopar compiles the network once, "
                "for one batch shape; use batch(..., drop_remainder=True) or a dataset size the batch size divides."
            )
        columns = dataset.get_col_names()
        net = self._train_network
        while isinstance(net, TrainOneStepCell) or type(net).__name__ in ("PipelineCell", "GradAccumulationCell"):
            net = net.network
        try:
            takes = [p for p in inspect.signature(net.construct).parameters.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
            varargs = any(p.kind == p.VAR_POSITIONAL for p in inspect.signature(net.construct).parameters.values())
        except (TypeError, ValueError):
            return
        if not varargs and len(takes) != len(columns):
            raise ValueError(
                f"The dataset has {len(columns)} columns {columns}, but {type(net).__name__}.construct takes {len(takes)} inputs "
                f"({', '.join(p.name for p in takes)}): project the columns the network takes."
            )

    def _pull(self):
        if self._job is not None:
            self._job.pull()

    @staticmethod
    def _global_batches(dataset, epoch, n, full_batch):
        """The job's batches: with several devices, every rank's batch (its shard) joined in rank order."""
        if n == 1 or full_batch:
            yield from dataset._rows(None, epoch)
            return
        for rows in zip(*[dataset._rows(r, epoch) for r in range(n)]):
            yield join_shards(rows)

    def eval(self, valid_dataset, callbacks=None, dataset_sink_mode=False):
        """The metrics given to ``Model`` over ``valid_dataset``: the network's outputs (and the
        loss, with ``loss_fn``) on every global batch, the metrics updated with them."""
        from ..nn.metrics import _metrics

        if callbacks:
            raise NotImplementedError("For 'Model.eval', autopar runs no callbacks during evaluation (callbacks must be None).")

        if not self._metrics:
            raise ValueError("For 'Model.eval', the Model needs 'metrics' (Model(network, loss_fn, optimizer, metrics={'acc'})).")
        metrics = _metrics(self._metrics)
        self._pull()
        eval_net = _LossAndOutputs(self._network, self._loss_fn) if self._loss_fn is not None else self._network
        eval_net.set_train(False)
        columns = valid_dataset.get_col_names()
        n = _context._device_num()
        full_batch = bool(_context._PARALLEL.get("full_batch", False))
        for m in metrics.values():
            m.clear()
        for batch in self._global_batches(valid_dataset, 0, n, full_batch):
            data, label = batch[:-1], batch[-1]
            if self._loss_fn is not None:
                _, (loss, logits) = run_network(eval_net, list(data) + [label], columns, self._amp)
            else:
                _, outs = run_network(eval_net, data, columns[:-1], self._amp)
                loss, logits = None, outs[0]
            for m in metrics.values():
                m._feed(logits, label, loss)
        return {name: m.eval() for name, m in metrics.items()}

    def predict(self, *predict_data, backend=None):
        """The network's output on ``predict_data`` (a Tensor, or a tuple for several outputs)."""
        self._pull()
        self._network.set_train(False)
        predictor, outs = run_network(self._network, predict_data, amp=self._amp)
        return Tensor(outs[0]) if predictor.single else tuple(Tensor(o) for o in outs)
