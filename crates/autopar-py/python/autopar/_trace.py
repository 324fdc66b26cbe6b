"""Tracing ``construct`` into autopar's graph, as MindSpore's graph mode compiles it: the
network runs once on symbolic tensors; every primitive it calls adds an op (named by the cell
path and the primitive's attribute, with its strategy from ``shard``), every parameter it
reads becomes a parameter of the graph, and Python control flow is unrolled."""

import contextlib

import numpy as np

from . import _native
from .common import dtype as mstype
from .common.parameter import Parameter
from .common.tensor import Tensor

_ACTIVE = []


def active():
    """The tracer of the construct being compiled, or None."""
    return _ACTIVE[-1] if _ACTIVE else None


class Tracer:
    def __init__(self):
        self.network = _native.Network(0)
        self.params = {}  # id(Parameter) -> (node, Parameter)
        self.only = None  # ids of the Parameters to train (None: every one that requires a gradient)
        self.amp = (None, None)  # the precision policy of a cell traced (auto_mixed_precision)
        self.consts = []  # (name, numpy value) of constant tensors, frozen parameters of the graph
        self.names = {}
        self.scope = []
        self.stage = None
        self.recompute = 0
        self.inputs = []

    @contextlib.contextmanager
    def tracing(self):
        _ACTIVE.append(self)
        try:
            yield self
        finally:
            _ACTIVE.pop()

    def _unique(self, name):
        n = self.names.get(name, 0)
        self.names[name] = n + 1
        return name if n == 0 else f"{name}-{n}"

    def input(self, name, array):
        dtype = wire_dtype(array.dtype)
        node = self.network.input(name, list(array.shape), str(dtype))
        self.inputs.append(name)
        return Tensor._traced(self, node, array.shape, dtype)

    def _wrap(self, node):
        shape, dtype = self.network.describe(node)
        return Tensor._traced(self, node, shape, dtype)

    def node_of(self, value, like=None):
        """The graph node of an op's input: a traced tensor, a parameter, or a constant."""
        if isinstance(value, Parameter):
            entry = self.params.get(id(value))
            if entry is None:
                same = next((p for _, p in self.params.values() if p.name == value.name), None)
                if same is not None:
                    raise ValueError(
                        f"The network has two parameters named {value.name!r} (shapes {tuple(same.shape)} and {tuple(value.shape)}): "
                        "give each Parameter a unique name."
                    )
                trainable = value.requires_grad and not value.__dict__.get("_frozen_here", False)
                trainable = trainable and (self.only is None or id(value) in self.only)
                node = self.network.parameter(value.name, list(value.shape), str(value._data.dtype), trainable)
                self.params[id(value)] = (node, value)
                return node
            return entry[0]
        if isinstance(value, Tensor):
            if value._is_traced():
                if value._tracer is not self:
                    raise RuntimeError("A tensor of another compiled network was used in this one.")
                return value._node
            array = value.asnumpy()
        else:
            array = np.asarray(value)
            if like is not None and array.dtype.kind in "fiu":
                array = array.astype(like)
        name = self._unique("const")
        node = self.network.parameter(name, list(array.shape), str(array.dtype), False)
        self.consts.append((name, array))
        return node

    def op(self, kind, prim_name, inputs, attrs=None, strategy=None):
        """Adds op ``kind`` over ``inputs`` (graph nodes); returns its output tensor."""
        scope = ".".join(s for s in self.scope if s)
        base = f"{scope}.{prim_name}" if scope else prim_name
        name = self._unique(base)
        try:
            node = self.network.op(kind, name, list(inputs), attrs or {})
            if strategy is not None:
                self.network.shard(node, strategy)
            if self.recompute:
                self.network.recompute(node)
        except (ValueError, TypeError) as e:
            raise type(e)(f"{e} (at {script_line()})") from None
        return self._wrap(node)

    @contextlib.contextmanager
    def cell(self, name, stage, recompute):
        """Inside the construct of a cell named ``name`` (its attribute, '' when it adds no prefix)."""
        self.scope.append(name)
        before = self.stage
        if stage is not None and stage >= 0:
            self.stage = stage
            self.network.set_pipeline_stage(stage)
        self.recompute += 1 if recompute else 0
        try:
            yield
        finally:
            self.scope.pop()
            self.recompute -= 1 if recompute else 0
            if self.stage != before:
                self.stage = before
                self.network.set_pipeline_stage(before)


def script_line():
    """Where the user's code called into autopar: the innermost frame outside the package."""
    import os
    import traceback

    package = os.path.dirname(os.path.abspath(__file__))
    for frame in reversed(traceback.extract_stack()):
        if not os.path.abspath(frame.filename).startswith(package + os.sep):
            return f"{frame.filename}, line {frame.lineno}: {frame.line}"
    return "construct"


def wire_dtype(dtype):
    """The type a value crosses into the engine in: float16 as float32, bool and the small or
    unsigned integers as int32."""
    dtype = np.dtype(dtype)
    if dtype == np.float16:
        return np.dtype(np.float32)
    if dtype == np.bool_ or (dtype.kind in "iu" and dtype not in (np.int32, np.int64)):
        return np.dtype(np.int32)
    return dtype


def wire(name, array):
    array = np.ascontiguousarray(array)
    array = array.astype(wire_dtype(array.dtype), copy=False)
    return (name, str(array.dtype), list(array.shape), array.astype(array.dtype.newbyteorder("<")).tobytes())


def unwire(entry):
    name, dtype, shape, data = entry
    return name, np.frombuffer(bytes(data), dtype=np.dtype(dtype).newbyteorder("<")).reshape(shape).astype(dtype)


__all__ = ["Tracer", "active", "wire", "unwire", "mstype"]
