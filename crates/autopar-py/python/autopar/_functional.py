"""MindSpore's functional training (``value_and_grad``, ``grad``) on autopar's engine.

``value_and_grad(fn, None, weights, has_aux)`` returns a function that, called on tensors,
compiles ``fn`` (its trace, once per input shapes) into a training job on the parallel
context's devices and runs the step's forward and backward passes there: the ranks keep the
gradients (each its pieces, synchronised as the step synchronises them). The loss comes back
at once; the gradients are tensors read from the ranks only when the script looks at them.
The optimizer called on them applies them on the ranks (each its pieces), or, when the script
computed new gradients from them, those values. ``has_aux``'s other outputs come from the
network run for inference on the same batch."""

import weakref

import numpy as np

from . import _context, _native
from ._trace import Tracer, unwire, wire
from .common import dtype as mstype
from .common.parameter import Parameter
from .common.tensor import Tensor
from .nn.cell import Cell
from .train.model import _Running

__all__ = ["value_and_grad", "grad"]


def _arrays(args, what):
    """The inputs as the job takes them: a tensor of a dataset sharded over the job's devices
    (``num_shards=get_group_size()``, without ``full_batch``) is the global batch, every rank's
    rows joined, as each rank of a MindSpore job reads its own."""
    n = _context._device_num()
    whole = n > 1 and not bool(_context._PARALLEL.get("full_batch", False))
    out = []
    for k, a in enumerate(args):
        joined = getattr(a, "_global", None) if isinstance(a, Tensor) else None
        if whole and joined is not None and joined[0] == n:
            out.append(joined[1])
        elif isinstance(a, Tensor):
            out.append(np.asarray(a.asnumpy()))
        elif isinstance(a, np.ndarray):
            out.append(a)
        elif what is None:
            out.append(np.asarray(a))
        else:
            raise TypeError(f"For '{what}', autopar takes the function's inputs as tensors, but input {k} is {type(a).__name__}.")
    return out


def job_arrays(values):
    """``values`` (tensors, arrays or numbers) as a job takes them ([`_arrays`])."""
    return _arrays(values, None)


class _Outputs(Cell):
    """A forward function as a cell: its outputs from ``first`` on (the aux outputs)."""

    def __init__(self, fn, first):
        super().__init__(auto_prefix=False)
        self.__dict__["_fn"] = fn
        self.__dict__["_first"] = first

    def construct(self, *args):
        out = self._fn(*args)
        outs = list(out) if isinstance(out, (tuple, list)) else [out]
        outs = outs[self._first:]
        return outs[0] if len(outs) == 1 else tuple(outs)


def _loss_of(out, has_aux, what):
    """The differentiated output of a forward function's result."""
    if isinstance(out, (tuple, list)):
        if not has_aux and len(out) > 1:
            raise NotImplementedError(
                f"For '{what}', the function returns {len(out)} outputs: autopar differentiates one loss; give has_aux=True to "
                "differentiate the first and return the others as they are."
            )
        out = out[0]
    if not isinstance(out, Tensor) or not out._is_traced():
        raise TypeError(f"For '{what}', the function must return a tensor computed from its inputs, but returned {out!r}.")
    return out


class _Step(_Running):
    """A forward function compiled into a training job for inputs of given shapes."""

    _state_with_params = False

    def __init__(self, fn, weights, has_aux, arrays, what):
        if int(_context._PARALLEL.get("pipeline_stages", 1) or 1) > 1:
            raise NotImplementedError(
                f"For '{what}', autopar runs pipeline stages through Model or a TrainOneStepCell(PipelineCell(...)); a function "
                "value_and_grad returned runs without stages (pipeline_stages=1)."
            )
        names = [f"input{i}" for i in range(len(arrays))]
        tracer = Tracer()
        tracer.only = {id(p) for p in weights}
        with tracer.tracing():
            inputs = [tracer.input(n, a) for n, a in zip(names, arrays)]
            loss = _loss_of(fn(*inputs), has_aux, what)
        self.loss_elements = max(loss.size, 1)
        self.params = [p for _, p in tracer.params.values()]
        used = {id(p) for p in self.params}
        unused = [p.name for p in weights if id(p) not in used]
        if unused:
            raise ValueError(f"For '{what}', the function does not use the weights {unused}: give the parameters it computes with.")
        self.weights = list(weights)
        self.names = names
        optimizer = getattr(weights, "_optimizer", None)
        self.optimizer = optimizer
        kind, lr, hyper, groups, prefixes = _optimizer_wire(optimizer)
        wires = [wire(p.name, p.asnumpy()) for p in self.params] + [wire(n, a) for n, a in tracer.consts]
        self.amp = tracer.amp  # auto_mixed_precision of a cell the function calls
        self.session = _native.Session(tracer.network, loss._node, _context._job_context(), wires, kind, lr, hyper, groups, prefixes,
                                       None, None, *self.amp)
        self.versions = {id(p): p._version for p in self.params}
        self.step = 0
        self.values = None
        # Whether the ranks hold gradients no update has applied yet, and whether an update was.
        self.pending = self.applied = False

    def gradients(self, arrays):
        self._push_changed()
        self.step += 1
        self.values = None
        loss = self.session.gradients([wire(n, a) for n, a in zip(self.names, arrays)])
        self.pending = True
        return loss / self.loss_elements

    def gradient(self, step, name):
        """The whole gradient of parameter ``name`` at ``step`` (read from the ranks once a step)."""
        if step != self.step:
            raise RuntimeError(
                "This gradient belongs to an earlier step: autopar's ranks keep the last step's gradients only; read a "
                "gradient before the next call of the function value_and_grad returned."
            )
        if self.values is None:
            if not self.pending:
                raise RuntimeError(
                    "This gradient was applied before it was read: autopar's ranks apply their gradients without keeping them; "
                    "read a gradient before calling the optimizer on it."
                )
            self.values = dict(unwire(e) for e in self.session.grads())
        return self.values[name]

    def apply(self, optimizer, grads):
        """``optimizer`` applied on the ranks: to their own gradients of the last step, or to
        ``grads`` (whole values, one per weight)."""
        if not self.pending:
            raise RuntimeError(
                f"For '{type(optimizer).__name__}', no gradients to apply: the ranks apply each step's gradients once; call the "
                "function value_and_grad returned before each update."
            )
        if optimizer is not self.optimizer:
            kind, lr, hyper, groups, _ = _optimizer_wire(optimizer)
            self.session.set_optimizer(kind, lr, hyper, groups)
            self.optimizer = optimizer
        pending = optimizer.__dict__.pop("_pending_state", None)
        if pending is not None:
            self._load_optimizer_state(*pending)
        given = None if grads is None else [wire(p.name, g) for p, g in zip(self.weights, grads)]
        self.session.update(given)
        self.pending = False
        self.applied = True
        self.mark_stale()


def _optimizer_wire(optimizer):
    """What the engine takes of an optimizer (an SGD of learning rate 0 for none yet: the first
    update gives the ranks the optimizer the script calls)."""
    if optimizer is None:
        return "SGD", [0.0], {"weight_decay": 0.0}, [], []
    return optimizer._kind, optimizer.learning_rate, optimizer.hyper, optimizer._groups_wire(), optimizer._state_prefixes


class _Gradient(Tensor):
    """A gradient the ranks hold: read (whole) when the script looks at it."""

    def __init__(self, step, name, shape, dtype):
        self.__dict__.update(_step=step, _at=step.step, _name=name, _shape=tuple(shape), _dtype=dtype, _value=None)
        self._tracer = self._node = None

    @property
    def shape(self):
        return self._shape

    @property
    def dtype(self):
        return mstype.from_numpy(np.dtype(self._dtype))

    @property
    def _data(self):
        if self._value is None:
            self.__dict__["_value"] = self._step.gradient(self._at, self._name).astype(self._dtype, copy=False)
        return self._value

    @_data.setter
    def _data(self, value):
        self.__dict__["_value"] = value


class _Gradients(tuple):
    """The gradients of one step, in the order of the weights."""


def _gradients(step):
    grads = _Gradients(_Gradient(step, p.name, p.shape, p._data.dtype) for p in step.weights)
    grads._step, grads._at = step, step.step
    return grads


def apply_gradients(optimizer, grads):
    """``optimizer(grads)`` for gradients of functional training: True when they were."""
    grads = tuple(grads)
    steps = {g._step for g in grads if isinstance(g, _Gradient)}
    if not steps:
        step = _LAST.get(tuple(id(p) for p in optimizer.parameters))
        if step is None:
            return False
    elif len(steps) > 1:
        raise ValueError("The gradients given to the optimizer come from different functions' steps: give one step's gradients.")
    else:
        step = steps.pop()
    cls = type(optimizer).__name__
    if {id(p) for p in optimizer.parameters} != {id(p) for p in step.weights}:
        raise ValueError(
            f"For '{cls}', the gradients are of other parameters than the optimizer updates: give value_and_grad the "
            "optimizer's parameters as its weights."
        )
    if len(grads) != len(step.weights):
        raise ValueError(f"For '{cls}', {len(grads)} gradients were given for the {len(step.weights)} weights the function was differentiated by.")
    # The optimizer's state lives on the ranks of the job that first applied it.
    home = optimizer.__dict__.get("_functional_home")
    home = home() if home is not None else None
    if home is not None and home is not step and home.applied:
        raise NotImplementedError(
            f"For '{cls}', its state (moments, step count) lives in the job of the function and input shapes it first updated "
            "with; autopar compiles a function once per input shapes: give every batch the same shape "
            "(batch(..., drop_remainder=True)) and update with one function's gradients."
        )
    optimizer.__dict__["_functional_home"] = weakref.ref(step)
    # Gradients untouched (never read, the step's own): the ranks apply their own pieces.
    untouched = all(isinstance(g, _Gradient) and g._step is step and g._at == step.step and g._name == p.name and g._value is None
                    for g, p in zip(grads, step.weights))
    if untouched:
        step.apply(optimizer, None)
        return True
    values = []
    for g, p in zip(grads, step.weights):
        v = np.asarray(g.asnumpy() if isinstance(g, Tensor) else g)
        if tuple(v.shape) != tuple(p.shape):
            raise ValueError(f"For '{cls}', the gradient given for {p.name} has shape {tuple(v.shape)}, the parameter {tuple(p.shape)}.")
        if v.dtype.kind != "f":
            raise TypeError(f"For '{cls}', the gradient given for {p.name} is {v.dtype}, not a float.")
        values.append(v)
    step.apply(optimizer, values)
    return True


# The last step compiled for each set of weights (by the ids of the optimizer's parameters), so
# that gradients the script computed itself find their job.
_LAST = weakref.WeakValueDictionary()


class _GradFunction:
    def __init__(self, fn, weights, has_aux, with_value, what):
        self.fn, self.weights, self.has_aux, self.with_value, self.what = fn, weights, has_aux, with_value, what
        self.steps = {}
        self.aux = _Outputs(fn, 1) if has_aux else None

    def __call__(self, *args):
        arrays = _arrays(args, self.what)
        key = (tuple((a.shape, str(a.dtype)) for a in arrays), _context._job_context())
        step = self.steps.get(key)
        if step is None:
            step = self.steps[key] = _Step(self.fn, self.weights, self.has_aux, arrays, self.what)
        _LAST[tuple(id(p) for p in self.weights)] = step
        loss = Tensor(np.array(step.gradients(arrays), dtype=np.float32))
        grads = _gradients(step)
        if self.has_aux:
            # The other outputs on the script's own inputs (a rank's shard of a sharded dataset),
            # in the step's precision.
            self.aux.__dict__["_amp"] = step.amp
            aux = self.aux(*[a if isinstance(a, Tensor) else Tensor(a) for a in args])
            value = (loss,) + (aux if isinstance(aux, tuple) else (aux,))
        else:
            value = loss
        if self.with_value:
            return value, grads
        return (grads, value[1:]) if self.has_aux else grads


def _check(what, fn, grad_position, weights):
    if not callable(fn):
        raise TypeError(f"For '{what}', 'fn' must be callable, but got {type(fn).__name__}.")
    if grad_position is not None:
        raise NotImplementedError(
            f"For '{what}', autopar differentiates with respect to parameters only, not the function's inputs "
            f"(grad_position={grad_position!r}): give grad_position=None and weights=optimizer.parameters."
        )
    if weights is None:
        raise ValueError(f"For '{what}', give 'weights' (e.g. optimizer.parameters): autopar differentiates with respect to parameters.")
    items = [weights] if isinstance(weights, Parameter) else list(weights)
    for p in items:
        if not isinstance(p, Parameter):
            raise TypeError(f"For '{what}', 'weights' must be Parameters, but got {type(p).__name__}.")
        if not p.requires_grad:
            raise ValueError(f"For '{what}', the weight {p.name} has requires_grad=False: differentiate by trainable parameters.")
    if isinstance(weights, Parameter):
        return [weights]
    return weights


def value_and_grad(fn, grad_position=0, weights=None, has_aux=False, return_ids=False):
    """MindSpore's ``value_and_grad``: ``fn``'s value and its gradients with respect to
    ``weights`` (``grad_position=None``), computed on the parallel context's devices."""
    if return_ids:
        raise NotImplementedError("For 'value_and_grad', autopar returns the gradients in the weights' order (return_ids=False).")
    weights = _check("value_and_grad", fn, grad_position, weights)
    return _GradFunction(fn, weights, has_aux, True, "value_and_grad")


def grad(fn, grad_position=0, weights=None, has_aux=False, return_ids=False):
    """MindSpore's ``grad``: ``fn``'s gradients with respect to ``weights``
    (``grad_position=None``; with ``has_aux`` also its other outputs)."""
    if return_ids:
        raise NotImplementedError("For 'grad', autopar returns the gradients in the weights' order (return_ids=False).")
    weights = _check("grad", fn, grad_position, weights)
    return _GradFunction(fn, weights, has_aux, False, "grad")
