"""MindSpore's primitives (``ops.MatMul()``, ``ops.ReLU()``, ...) with ``shard(in_strategy)``.

Inside a ``Cell``'s ``construct`` each call adds an op to the network autopar compiles, with
the primitive's strategy; outside one, the element-wise ops, products, reductions and shape
ops compute with numpy. A primitive autopar lacks does not exist here (an ``AttributeError``
naming it), and an argument it does not take is a ``TypeError`` or ``ValueError`` naming it.
"""

import numpy as np

from .. import _trace
from ..common import dtype as mstype
from ..common.tensor import Tensor
from ..parallel.layout import Layout, layouts_text

__all__ = [
    "Primitive", "MatMul", "BatchMatMul", "Add", "Sub", "Mul", "RealDiv", "Div", "BiasAdd", "ReLU", "GeLU", "SiLU",
    "Tanh", "Sigmoid", "Exp", "Log", "Sqrt", "Neg", "Softmax", "LogSoftmax", "ReduceMean", "ReduceSum", "ReduceMax",
    "Reshape", "Transpose", "Flatten", "Squeeze", "ExpandDims", "Gather", "OneHot", "Cast", "Concat", "Conv2D",
    "MaxPool", "AvgPool", "BatchNorm", "LayerNorm", "Dropout", "SoftmaxCrossEntropyWithLogits",
    "SparseSoftmaxCrossEntropyWithLogits", "Shape", "GradOperation", "AllReduce",
    "matmul", "relu", "gelu", "reshape", "transpose", "cast", "softmax", "log_softmax", "mean", "sum", "add", "sub", "mul",
    "div", "exp", "log", "sqrt", "tanh", "sigmoid", "flatten", "square", "shape", "scalar_to_array", "ones", "zeros",
    "depend",
]


def depend(value, expr):
    """MindSpore's ``ops.depend``: ``value``, once ``expr`` has run (autopar runs a script's
    statements in order)."""
    return value


def _check_strategy(prim, strategy, what):
    if strategy is None:
        return None
    if isinstance(strategy, tuple) and strategy and all(isinstance(s, Layout) for s in strategy):
        layouts_text(strategy, prim)
        return strategy
    if isinstance(strategy, tuple) and any(isinstance(s, Layout) for s in strategy):
        raise TypeError(f"For '{prim}', the '{what}' must be all Layouts or all tuples of ints, but got {strategy!r}.")
    if not isinstance(strategy, tuple) or not all(isinstance(s, tuple) for s in strategy):
        raise TypeError(f"For '{prim}', the '{what}' must be a tuple of tuples of ints, like ((2, 4), (4, 1)), but got {strategy!r}.")
    for s in strategy:
        for v in s:
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"For '{prim}', every split in '{what}' must be a positive int, but got {strategy!r}.")
    return strategy


def _is_tensor(x):
    return isinstance(x, Tensor)


class Primitive:
    """A MindSpore primitive: called on tensors; ``shard`` gives its strategy."""

    def __init__(self, name=None):
        self.name = name or type(self).__name__
        self.in_strategy = None
        self.out_strategy = None
        self._out_applied = False
        self._attr = None
        self.attrs = {}

    def shard(self, in_strategy=None, out_strategy=None):
        """MindSpore's ``Primitive.shard``: how each input is split, a tuple of splits per tensor
        input or a ``Layout`` per tensor input (named device axes)."""
        self.in_strategy = _check_strategy(self.name, in_strategy, "in_strategy")
        self.out_strategy = _check_strategy(self.name, out_strategy, "out_strategy")
        if self.out_strategy is not None:
            if len(self.out_strategy) != 1:
                raise ValueError(
                    f"For '{self.name}', the 'out_strategy' gives {len(self.out_strategy)} layouts; autopar takes one, for the output."
                )
            if self.in_strategy is None:
                raise ValueError(f"For '{self.name}', an 'out_strategy' needs an 'in_strategy'.")
            if isinstance(self.out_strategy[0], Layout) != isinstance(self.in_strategy[0], Layout):
                raise ValueError(
                    "The in_strategy type must equal to the out_strategy type, one using tuple(tuple) and the other using "
                    "tuple(Layout) is not allowed."
                )
        return self

    def add_prim_attr(self, name, value):
        self.attrs[name] = value
        return self

    def recompute(self, mode=True):
        self.attrs["recompute"] = bool(mode)
        return self

    def __call__(self, *args):
        tracer = _trace.active()
        if tracer is None:
            return self._eager(*args)
        self._out_applied = False
        out = self._trace(tracer, *args)
        if self.out_strategy is not None and (not self._out_applied or isinstance(out, tuple)):
            raise NotImplementedError(
                f"For '{self.name}', autopar applies an 'out_strategy' to primitives with one tensor output computed by one "
                "op (MatMul, BatchMatMul, the element-wise ops, ...); leave it out here."
            )
        return out

    # The op of a traced call: kind, tensor inputs, attributes.
    def _trace(self, tracer, *args):
        raise NotImplementedError(f"{self.name} cannot be compiled by autopar.")

    def _eager(self, *args):
        fn = getattr(self, "_numpy", None)
        if fn is None:
            raise RuntimeError(
                f"{self.name} runs inside a Cell's construct, which autopar compiles into its graph (as mindspore.GRAPH_MODE); "
                "call the cell through mindspore.train.Model."
            )
        arrays = [a.asnumpy() if _is_tensor(a) else a for a in args]
        out = fn(*arrays)
        return Tensor(out) if isinstance(out, np.ndarray) or np.isscalar(out) else out

    def _emit(self, tracer, kind, tensors, attrs=None, kept=None):
        """Adds the op over ``tensors``; ``kept`` names which of the strategy's entries they
        have (the strategy covers tensor inputs only, as in MindSpore)."""
        like = next((t.dtype for t in tensors if _is_tensor(t)), None)
        nodes = [tracer.node_of(t, mstype.to_numpy(like) if like is not None else None) for t in tensors]
        strategy = None
        if self.in_strategy is not None:
            entries = self.in_strategy if kept is None else tuple(self.in_strategy[i] for i in kept if i < len(self.in_strategy))
            if entries and isinstance(entries[0], Layout):
                strategy = layouts_text(tuple(entries), self.name)
            else:
                strategy = str(tuple(entries))
        out = tracer.op(kind, self._attr or self.name, nodes, attrs, strategy)
        if self.out_strategy is not None and _is_tensor(out):
            # The output laid out as asked (a MatMul's pending sum reduce-scattered rather than
            # all-reduced): an exact identity whose input takes that layout.
            identity = Mul()
            identity._attr = (self._attr or self.name) + ".out_strategy"
            identity.shard((self.out_strategy[0],))
            out = identity(out, 1.0)
            self._out_applied = True
        return out


class MatMul(Primitive):
    def __init__(self, transpose_a=False, transpose_b=False):
        super().__init__()
        self.transpose_a, self.transpose_b = bool(transpose_a), bool(transpose_b)

    def _trace(self, tracer, a, b):
        return self._emit(tracer, "MatMul", [a, b], {"transpose_a": self.transpose_a, "transpose_b": self.transpose_b})

    def _numpy(self, a, b):
        return np.matmul(a.T if self.transpose_a else a, b.T if self.transpose_b else b)


class BatchMatMul(MatMul):
    def _trace(self, tracer, a, b):
        return self._emit(tracer, "BatchMatMul", [a, b], {"transpose_a": self.transpose_a, "transpose_b": self.transpose_b})

    def _numpy(self, a, b):
        t = lambda x, on: np.swapaxes(x, -1, -2) if on else x
        return np.matmul(t(a, self.transpose_a), t(b, self.transpose_b))


def _scalar(v):
    """A value tensor of one element as the number it holds (a constant of construct)."""
    if _is_tensor(v) and not v._is_traced() and v.ndim == 0:
        return v.asnumpy().item()
    return v


class _Binary(Primitive):
    _kind = None
    _fn = None

    def _trace(self, tracer, x, y):
        x, y = _scalar(x), _scalar(y)
        if not _is_tensor(x) and not _is_tensor(y):
            return type(self)._fn(x, y)
        scalar = y if not _is_tensor(y) else (x if not _is_tensor(x) else None)
        if scalar is not None and np.ndim(scalar) == 0:
            t = x if _is_tensor(x) else y
            if self._kind == "Mul":
                return self._emit(tracer, "Scale", [t], {"factor": float(scalar)}, kept=[0 if t is x else 1])
            if self._kind in ("RealDiv", "Div") and t is x:
                return self._emit(tracer, "Scale", [t], {"factor": 1.0 / float(scalar)}, kept=[0])
            const = np.full([1], scalar, dtype=mstype.to_numpy(t.dtype))
            pair = [x, const] if t is x else [const, y]
            return self._emit(tracer, self._kind, pair, kept=[0] if t is x else [1])
        if _is_tensor(x) and _is_tensor(y) and x.dtype != y.dtype:
            # MindSpore's implicit conversion: an integer operand takes the float one's type.
            fx, fy = (mstype.to_numpy(t.dtype).kind == "f" for t in (x, y))
            if fx != fy:
                cast = Cast()
                cast._attr = (self._attr or self.name) + ".cast"
                x, y = (x, cast(y, x.dtype)) if fx else (cast(x, y.dtype), y)
        return self._emit(tracer, self._kind, [x, y])

    def _numpy(self, x, y):
        return type(self)._fn(np.asarray(x), np.asarray(y))


class Add(_Binary):
    _kind, _fn = "Add", staticmethod(np.add)


class Sub(_Binary):
    _kind, _fn = "Sub", staticmethod(np.subtract)


class Mul(_Binary):
    _kind, _fn = "Mul", staticmethod(np.multiply)


class RealDiv(_Binary):
    _kind, _fn = "RealDiv", staticmethod(np.true_divide)


Div = RealDiv


class BiasAdd(Primitive):
    def __init__(self, data_format="NCHW"):
        super().__init__()
        if data_format != "NCHW":
            raise NotImplementedError(f"For '{self.name}', autopar adds the bias along dimension 1 (NCHW), but got data_format={data_format!r}.")

    def _trace(self, tracer, x, bias):
        return self._emit(tracer, "BiasAdd", [x, bias])

    def _numpy(self, x, bias):
        return x + bias.reshape((1, -1) + (1,) * (x.ndim - 2))


class _Unary(Primitive):
    _kind = None
    _fn = None

    def _trace(self, tracer, x):
        return self._emit(tracer, self._kind, [x])

    def _numpy(self, x):
        return type(self)._fn(x)


def _gelu(x):
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x**3)))


class ReLU(_Unary):
    _kind, _fn = "ReLU", staticmethod(lambda x: np.maximum(x, 0))


class GeLU(_Unary):
    _kind, _fn = "GeLU", staticmethod(_gelu)


class SiLU(_Unary):
    _kind, _fn = "SiLU", staticmethod(lambda x: x / (1.0 + np.exp(-x)))


class Tanh(_Unary):
    _kind, _fn = "Tanh", staticmethod(np.tanh)


class Sigmoid(_Unary):
    _kind, _fn = "Sigmoid", staticmethod(lambda x: 1.0 / (1.0 + np.exp(-x)))


class Exp(_Unary):
    _kind, _fn = "Exp", staticmethod(np.exp)


class Log(_Unary):
    _kind, _fn = "Log", staticmethod(np.log)


class Sqrt(_Unary):
    _kind, _fn = "Sqrt", staticmethod(np.sqrt)


class Neg(_Unary):
    _kind, _fn = "Neg", staticmethod(np.negative)


class Flatten(_Unary):
    _kind, _fn = "Flatten", staticmethod(lambda x: x.reshape(x.shape[0], -1))


def _softmax(x, axis):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


class Softmax(Primitive):
    def __init__(self, axis=-1):
        super().__init__()
        axis = axis[0] if isinstance(axis, (tuple, list)) and len(axis) == 1 else axis
        if not isinstance(axis, int):
            raise NotImplementedError(f"For '{self.name}', autopar takes one axis, but got {axis!r}.")
        self.axis = axis

    def _trace(self, tracer, x):
        return self._emit(tracer, self.name, [x], {"axis": self.axis})

    def _numpy(self, x):
        return _softmax(x, self.axis)


class LogSoftmax(Softmax):
    def _numpy(self, x):
        return np.log(_softmax(x, self.axis))


def _axes(axis):
    if axis is None:
        return []
    return [int(axis)] if isinstance(axis, int) else [int(a) for a in axis]


class _Reduce(Primitive):
    _kind = None

    def __init__(self, keep_dims=False):
        super().__init__()
        self.keep_dims = bool(keep_dims)

    def _trace(self, tracer, x, axis=()):
        return self._emit(tracer, self._kind, [x], {"axis": _axes(axis), "keep_dims": self.keep_dims})

    def _numpy(self, x, axis=()):
        axes = tuple(_axes(axis)) or None
        return {"ReduceMean": np.mean, "ReduceSum": np.sum, "ReduceMax": np.max}[self._kind](x, axis=axes, keepdims=self.keep_dims)


class ReduceMean(_Reduce):
    _kind = "ReduceMean"


class ReduceSum(_Reduce):
    _kind = "ReduceSum"


class ReduceMax(_Reduce):
    _kind = "ReduceMax"


class Reshape(Primitive):
    def _trace(self, tracer, x, shape):
        return self._emit(tracer, "Reshape", [x], {"shape": [int(s) for s in shape]})

    def _numpy(self, x, shape):
        return np.reshape(x, shape)


class Transpose(Primitive):
    def _trace(self, tracer, x, perm):
        return self._emit(tracer, "Transpose", [x], {"perm": [int(p) for p in perm]})

    def _numpy(self, x, perm):
        return np.transpose(x, perm)


class Squeeze(Primitive):
    def __init__(self, axis=()):
        super().__init__()
        self.axis = _axes(axis)

    def _trace(self, tracer, x):
        axes = [a % x.ndim for a in self.axis] or [i for i, s in enumerate(x.shape) if s == 1]
        shape = [s for i, s in enumerate(x.shape) if i not in axes]
        return self._emit(tracer, "Reshape", [x], {"shape": shape})

    def _numpy(self, x):
        return np.squeeze(x, axis=tuple(self.axis) or None)


class ExpandDims(Primitive):
    def _trace(self, tracer, x, axis):
        shape = list(x.shape)
        shape.insert(axis % (x.ndim + 1), 1)
        return self._emit(tracer, "Reshape", [x], {"shape": shape})

    def _numpy(self, x, axis):
        return np.expand_dims(x, axis)


class Gather(Primitive):
    def _trace(self, tracer, params, indices, axis=0):
        return self._emit(tracer, "Gather", [params, indices], {"axis": int(axis)})

    def _numpy(self, params, indices, axis=0):
        return np.take(params, indices, axis=axis)


class OneHot(Primitive):
    def __init__(self, axis=-1):
        super().__init__()
        if axis != -1:
            raise NotImplementedError(f"For '{self.name}', autopar puts the classes last (axis=-1), but got axis={axis}.")

    def _trace(self, tracer, indices, depth, on_value=1.0, off_value=0.0):
        on, off = float(np.asarray(on_value.asnumpy() if _is_tensor(on_value) else on_value)), float(
            np.asarray(off_value.asnumpy() if _is_tensor(off_value) else off_value))
        if (on, off) != (1.0, 0.0):
            raise NotImplementedError(f"For '{self.name}', autopar makes one-hot vectors of 1 and 0, but got on={on}, off={off}.")
        dt = on_value.dtype if _is_tensor(on_value) else mstype.float32
        return self._emit(tracer, "OneHot", [indices], {"depth": int(depth), "dtype": str(mstype.to_numpy(dt))})

    def _numpy(self, indices, depth, on_value=1.0, off_value=0.0):
        out = np.full(np.shape(indices) + (depth,), off_value, dtype=np.asarray(on_value).dtype)
        np.put_along_axis(out, np.expand_dims(indices, -1), on_value, -1)
        return out


class Cast(Primitive):
    def _trace(self, tracer, x, dtype):
        want = mstype.to_numpy(dtype)
        if want == mstype.to_numpy(x.dtype):
            return x
        return self._emit(tracer, "Cast", [x], {"dtype": str(want)})

    def _numpy(self, x, dtype):
        return np.asarray(x).astype(mstype.to_numpy(dtype))


class Concat(Primitive):
    def __init__(self, axis=0):
        super().__init__()
        self.axis = int(axis)

    def _trace(self, tracer, xs):
        return self._emit(tracer, "Concat", list(xs), {"axis": self.axis})

    def _numpy(self, xs):
        return np.concatenate(xs, axis=self.axis)


def _pair(v, what, prim):
    if isinstance(v, int):
        return [v, v]
    v = list(v)
    if len(v) == 4:
        v = v[2:]
    if len(v) != 2:
        raise ValueError(f"For '{prim}', '{what}' must be an int or a pair of ints, but got {v!r}.")
    return [int(a) for a in v]


def _padding(pad_mode, pad, kernel, stride, dilation, shape):
    """[top, bottom, left, right] for MindSpore's pad modes over an NCHW input."""
    if pad_mode == "valid":
        return [0, 0, 0, 0]
    if pad_mode == "pad":
        if isinstance(pad, int):
            return [pad] * 4
        pad = [int(p) for p in pad]
        return [pad[0], pad[0], pad[1], pad[1]] if len(pad) == 2 else pad
    if pad_mode == "same":
        out = []
        for i, size in enumerate(shape[2:]):
            want = -(-size // stride[i])
            need = max((want - 1) * stride[i] + (kernel[i] - 1) * dilation[i] + 1 - size, 0)
            out += [need // 2, need - need // 2]
        return out
    raise ValueError(f"pad_mode must be 'same', 'valid' or 'pad', but got {pad_mode!r}.")


class Conv2D(Primitive):
    def __init__(self, out_channel, kernel_size, mode=1, pad_mode="valid", pad=0, stride=1, dilation=1, group=1, data_format="NCHW"):
        super().__init__()
        if data_format != "NCHW":
            raise NotImplementedError(f"For '{self.name}', autopar computes NCHW, but got data_format={data_format!r}.")
        self.kernel = _pair(kernel_size, "kernel_size", self.name)
        self.stride, self.dilation = _pair(stride, "stride", self.name), _pair(dilation, "dilation", self.name)
        self.pad_mode, self.pad, self.group = pad_mode.lower(), pad, int(group)

    def _trace(self, tracer, x, w):
        pad = _padding(self.pad_mode, self.pad, self.kernel, self.stride, self.dilation, x.shape)
        return self._emit(tracer, "Conv2D", [x, w], {"stride": self.stride, "pad": pad, "dilation": self.dilation, "group": self.group})


class _Pool(Primitive):
    _kind = None

    def __init__(self, kernel_size=1, strides=1, pad_mode="valid", data_format="NCHW", padding=0):
        super().__init__()
        if data_format != "NCHW":
            raise NotImplementedError(f"For '{self.name}', autopar computes NCHW, but got data_format={data_format!r}.")
        self.kernel, self.strides, self.pad_mode = _pair(kernel_size, "kernel_size", self.name), _pair(strides, "strides", self.name), pad_mode.lower()
        self.padding = padding

    def _trace(self, tracer, x):
        pad = _padding(self.pad_mode, self.padding, self.kernel, self.strides, [1, 1], x.shape)
        if self._kind == "AvgPool" and self.pad_mode == "same" and any(pad):
            raise NotImplementedError(
                f"For '{self.name}', pad_mode='same' here pads {pad} and MindSpore leaves padded cells out of each average, "
                "which autopar does not yet: choose a kernel and stride that need no padding, or pad_mode='valid'."
            )
        return self._emit(tracer, self._kind, [x], {"kernel_size": self.kernel, "strides": self.strides, "pad": pad})


class MaxPool(_Pool):
    _kind = "MaxPool"


class AvgPool(_Pool):
    _kind = "AvgPool"


class BatchNorm(Primitive):
    """MindSpore's ``BatchNorm``: with ``momentum`` the weight of the batch's statistics in the
    moving ones (``moving = (1 - momentum) * moving + momentum * batch``)."""

    def __init__(self, is_training=False, epsilon=1e-5, momentum=0.1, data_format="NCHW"):
        super().__init__()
        if data_format != "NCHW":
            raise NotImplementedError(f"For '{self.name}', autopar computes NCHW, but got data_format={data_format!r}.")
        self.is_training, self.epsilon, self.momentum = bool(is_training), float(epsilon), float(momentum)
        # The engine's momentum is the moving statistics' own weight (nn.BatchNorm2d's meaning).
        self._keep = 1.0 - self.momentum

    def _trace(self, tracer, x, scale, bias, mean, variance):
        y = self._emit(tracer, "BatchNorm", [x, scale, bias, mean, variance],
                       {"is_training": self.is_training, "epsilon": self.epsilon, "momentum": self._keep})
        return (y, None, None, None, None)


class LayerNorm(Primitive):
    def __init__(self, begin_norm_axis=1, begin_params_axis=1, epsilon=1e-7):
        super().__init__()
        self.begin_norm_axis, self.begin_params_axis, self.epsilon = int(begin_norm_axis), int(begin_params_axis), float(epsilon)

    def _trace(self, tracer, x, gamma, beta):
        norm, params = self.begin_norm_axis % x.ndim, self.begin_params_axis % x.ndim
        if norm != params:
            raise NotImplementedError(
                f"For '{self.name}', autopar's gamma and beta cover the normalized dimensions (begin_params_axis = begin_norm_axis), "
                f"but got {self.begin_params_axis} and {self.begin_norm_axis}."
            )
        return (self._emit(tracer, "LayerNorm", [x, gamma, beta], {"begin_norm_axis": self.begin_norm_axis, "epsilon": self.epsilon}), None, None)


class Dropout(Primitive):
    def __init__(self, keep_prob=0.5, Seed0=0, Seed1=0):
        super().__init__()
        self.keep_prob, self.seed = float(keep_prob), int(Seed0) * 65536 + int(Seed1)

    def _trace(self, tracer, x):
        return (self._emit(tracer, "Dropout", [x], {"keep_prob": self.keep_prob, "seed": self.seed}), None)


class SparseSoftmaxCrossEntropyWithLogits(Primitive):
    """The mean softmax cross-entropy of ``logits [N, C]`` against class indices ``labels [N]``."""

    def __init__(self, is_grad=False):
        super().__init__()

    def _trace(self, tracer, logits, labels):
        return self._emit(tracer, "SoftmaxCrossEntropyWithLogits", [logits, labels])


class SoftmaxCrossEntropyWithLogits(Primitive):
    """Per-sample softmax cross-entropy against dense (one-hot or soft) labels: ``(loss, grad)``."""

    def _trace(self, tracer, logits, labels):
        logp = LogSoftmax(-1)
        logp._attr = (self._attr or self.name) + ".log_softmax"
        prod = Mul()
        prod._attr = (self._attr or self.name) + ".mul"
        total = ReduceSum(False)
        total._attr = (self._attr or self.name) + ".sum"
        neg = Neg()
        neg._attr = (self._attr or self.name) + ".neg"
        if self.in_strategy is not None:
            logp.shard((self.in_strategy[0],))
            prod.shard(self.in_strategy)
            total.shard((self.in_strategy[0],))
        return (neg(total(prod(labels, logp(logits)), -1)), None)


class GradOperation:
    """MindSpore's ``GradOperation``: not run by autopar (it trains through Model or TrainOneStepCell)."""

    def __init__(self, get_all=False, get_by_list=False, sens_param=False):
        raise NotImplementedError(
            "autopar does not run GradOperation yet: use mindspore.value_and_grad(fn, None, optimizer.parameters) or "
            "mindspore.grad, train with mindspore.train.Model, or a TrainOneStepCell called on tensors."
        )


class AllReduce:
    """MindSpore's ``AllReduce`` primitive for hybrid_parallel networks: built with autopar's Rust API."""

    def __init__(self, op="sum", group=None):
        raise NotImplementedError(
            "autopar's Python front end plans whole networks; hybrid_parallel's rank-by-rank networks with their own "
            "collectives are built with autopar's Rust API (GraphBuilder::all_reduce)."
        )


class Shape(Primitive):
    def __call__(self, x):
        return tuple(x.shape)


# The functional forms.
def shape(x):
    return tuple(x.shape)


def scalar_to_array(x):
    return Tensor(np.array(x, dtype=np.float32))


def ones(shape, dtype=mstype.float32):
    return Tensor(np.ones(shape, dtype=mstype.to_numpy(dtype)))


def zeros(shape, dtype=mstype.float32):
    return Tensor(np.zeros(shape, dtype=mstype.to_numpy(dtype)))


def matmul(a, b):
    return MatMul()(a, b)


def relu(x):
    return ReLU()(x)


def gelu(x, approximate="tanh"):
    return GeLU()(x)


def reshape(x, shape):
    return Reshape()(x, shape)


def transpose(x, perm):
    return Transpose()(x, perm)


def cast(x, dtype):
    return Cast()(x, dtype)


def softmax(x, axis=-1):
    return Softmax(axis)(x)


def log_softmax(x, axis=-1):
    return LogSoftmax(axis)(x)


def mean(x, axis=None, keep_dims=False):
    return ReduceMean(keep_dims)(x, () if axis is None else axis)


def sum(x, dim=None, keepdim=False):  # noqa: A001 (MindSpore's name)
    return ReduceSum(keepdim)(x, () if dim is None else dim)


def add(x, y):
    return Add()(x, y)


def sub(x, y):
    return Sub()(x, y)


def mul(x, y):
    return Mul()(x, y)


def div(x, y):
    return RealDiv()(x, y)


def exp(x):
    return Exp()(x)


def log(x):
    return Log()(x)


def sqrt(x):
    return Sqrt()(x)


def tanh(x):
    return Tanh()(x)


def sigmoid(x):
    return Sigmoid()(x)


def flatten(x):
    return Flatten()(x)


def square(x):
    return Mul()(x, x)
