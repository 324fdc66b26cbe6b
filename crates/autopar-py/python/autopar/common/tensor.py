"""``Tensor``: a value (numpy array) outside a network, or a node of the graph while a
``Cell``'s ``construct`` is traced. Arithmetic on traced tensors adds ops to the graph."""

import numpy as np

from . import dtype as mstype

__all__ = ["Tensor"]


def _as_array(data, dtype):
    if isinstance(data, Tensor):
        data = data.asnumpy()
    want = mstype.to_numpy(dtype) if dtype is not None else None
    if want is None:
        array = np.asarray(data)
        # MindSpore's defaults: Python floats are float32, Python ints int64.
        if array.dtype == np.float64 and not isinstance(data, np.ndarray):
            array = array.astype(np.float32)
        if array.dtype.kind in "iu" and not isinstance(data, np.ndarray):
            array = array.astype(np.int64)
        return array
    return np.asarray(data, dtype=want)


class Tensor:
    """MindSpore's ``Tensor(input_data=None, dtype=None, shape=None, init=None)``."""

    def __init__(self, input_data=None, dtype=None, shape=None, init=None, const_arg=False, internal=False):
        self._node = None
        self._tracer = None
        if init is not None:
            from .initializer import _materialize

            if shape is None:
                raise ValueError("Tensor with 'init' needs 'shape'.")
            self._data = _materialize(init, shape, dtype or mstype.float32)
            return
        if input_data is None:
            if shape is None:
                raise ValueError("Tensor needs 'input_data', or 'shape' with 'dtype'.")
            self._data = np.zeros(shape, dtype=mstype.to_numpy(dtype or mstype.float32))
            return
        self._data = _as_array(input_data, dtype)

    @classmethod
    def _traced(cls, tracer, node, shape, numpy_dtype):
        t = cls.__new__(cls)
        t._tracer, t._node, t._data = tracer, node, None
        t._traced_shape, t._traced_dtype = tuple(shape), np.dtype(numpy_dtype)
        return t

    def _is_traced(self):
        return self._node is not None

    @property
    def shape(self):
        return self._traced_shape if self._is_traced() else tuple(self._data.shape)

    @property
    def dtype(self):
        return mstype.from_numpy(self._traced_dtype if self._is_traced() else self._data.dtype)

    @property
    def ndim(self):
        return len(self.shape)

    @property
    def size(self):
        return int(np.prod(self.shape, dtype=np.int64))

    def dim(self):
        return self.ndim

    def asnumpy(self):
        """The values as a numpy array."""
        if self._is_traced():
            raise RuntimeError(
                "A tensor inside construct has no value while the network is compiled: autopar runs construct in "
                "graph mode (as mindspore.GRAPH_MODE); read values after training, from the parameters or callbacks."
            )
        return self._data

    def numpy(self):
        return self.asnumpy()

    def __array__(self, dtype=None, copy=None):
        a = self.asnumpy()
        return a if dtype is None else a.astype(dtype)

    def item(self):
        return self.asnumpy().item()

    def __float__(self):
        return float(self.asnumpy())

    def __int__(self):
        return int(self.asnumpy())

    def __len__(self):
        if not self.shape:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    def __bool__(self):
        # A one-element tensor's truth (a traced one has no value yet: asnumpy says so).
        return bool(self.asnumpy())

    def __repr__(self):
        if self._is_traced():
            return f"Tensor(shape={list(self.shape)}, dtype={self.dtype}, traced)"
        return f"Tensor(shape={list(self.shape)}, dtype={self.dtype}, value=\n{self.asnumpy()})"

    def __str__(self):
        return repr(self) if self._is_traced() else str(self.asnumpy())

    def astype(self, dtype):
        from .. import ops

        return ops.Cast()(self, dtype)

    def reshape(self, *shape):
        from .. import ops

        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        return ops.Reshape()(self, shape)

    def view(self, *shape):
        return self.reshape(*shape)

    def transpose(self, *perm):
        from .. import ops

        if len(perm) == 1 and isinstance(perm[0], (tuple, list)):
            perm = tuple(perm[0])
        if not perm:
            perm = tuple(reversed(range(self.ndim)))
        return ops.Transpose()(self, perm)

    def squeeze(self, axis=None):
        from .. import ops

        return ops.Squeeze(() if axis is None else axis)(self)

    def expand_dims(self, axis):
        from .. import ops

        return ops.ExpandDims()(self, axis)

    def mean(self, axis=None, keep_dims=False):
        from .. import ops

        return ops.ReduceMean(keep_dims)(self, () if axis is None else axis)

    def sum(self, axis=None, keepdims=False):
        from .. import ops

        return ops.ReduceSum(keepdims)(self, () if axis is None else axis)

    def _binary(self, kind, other, reverse=False):
        from .. import ops

        prim = getattr(ops, kind)()
        return prim(other, self) if reverse else prim(self, other)

    def __add__(self, other):
        return self._binary("Add", other)

    def __radd__(self, other):
        return self._binary("Add", other, True)

    def __sub__(self, other):
        return self._binary("Sub", other)

    def __rsub__(self, other):
        return self._binary("Sub", other, True)

    def __mul__(self, other):
        return self._binary("Mul", other)

    def __rmul__(self, other):
        return self._binary("Mul", other, True)

    def __truediv__(self, other):
        return self._binary("RealDiv", other)

    def __rtruediv__(self, other):
        return self._binary("RealDiv", other, True)

    def __matmul__(self, other):
        from .. import ops

        return ops.MatMul()(self, other)

    def __neg__(self):
        from .. import ops

        return ops.Neg()(self)

    def __getitem__(self, index):
        if self._is_traced():
            raise TypeError("autopar cannot index a tensor inside construct yet; use ops.Gather, ops.Reshape or ops.Transpose.")
        return Tensor(self.asnumpy()[index])
