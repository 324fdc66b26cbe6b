"""``Parameter``: a named tensor a network learns (or keeps, with ``requires_grad=False``)."""

import numpy as np

from .tensor import Tensor

__all__ = ["Parameter", "ParameterTuple"]

_DEFAULT_NAME = "Parameter"


class Parameter(Tensor):
    """MindSpore's ``Parameter(default_input, name=None, requires_grad=True, layerwise_parallel=False, parallel_optimizer=True)``."""

    def __init__(self, default_input, name=None, requires_grad=True, layerwise_parallel=False, parallel_optimizer=True, **kwargs):
        if isinstance(default_input, Tensor) and default_input._is_traced():
            raise TypeError("A Parameter's value must be known when it is made, not a tensor of a traced construct.")
        if isinstance(default_input, (int, float)) and not isinstance(default_input, bool):
            default_input = Tensor(default_input)
        super().__init__(np.array(np.asarray(default_input), copy=True) if not isinstance(default_input, Tensor) else default_input.asnumpy().copy())
        if name is not None and not isinstance(name, str):
            raise TypeError(f"The type of the Parameter's name must be str, but got {type(name)}.")
        self.name = name or _DEFAULT_NAME
        self.requires_grad = bool(requires_grad)
        self.layerwise_parallel = bool(layerwise_parallel)
        self.parallel_optimizer = bool(parallel_optimizer)
        self._version = 0

    def asnumpy(self):
        """The value (after the training steps a running job has taken with it)."""
        job = self.__dict__.pop("_stale", None)
        if job is not None:
            job.pull()
        return self._data

    def set_data(self, data, slice_shape=False):
        """Replaces the value (same shape), e.g. from a loaded checkpoint."""
        self.__dict__.pop("_stale", None)
        value = np.asarray(data.asnumpy() if isinstance(data, Tensor) else data)
        if tuple(value.shape) != tuple(self._data.shape):
            raise ValueError(f"Parameter {self.name}: the new value has shape {tuple(value.shape)}, the parameter {tuple(self._data.shape)}.")
        self._data = value.astype(self._data.dtype, copy=True)
        self._version += 1
        return self

    def _set_from_job(self, value):
        # The value a training job computed (that job records the new version as its own).
        self._data = value.astype(self._data.dtype, copy=False).reshape(self._data.shape)
        self._version += 1

    def value(self):
        """The parameter itself, as a tensor (MindSpore's ``Parameter.value()``)."""
        return self

    def clone(self, init="same"):
        return Parameter(self.asnumpy().copy(), self.name, self.requires_grad, self.layerwise_parallel, self.parallel_optimizer)

    def __repr__(self):
        return f"Parameter (name={self.name}, shape={self.shape}, dtype={self.dtype}, requires_grad={self.requires_grad})"


class ParameterTuple(tuple):
    """A tuple of Parameters (``net.trainable_params()`` as MindSpore's optimizers take it)."""

    def __new__(cls, iterable):
        items = tuple(iterable)
        for p in items:
            if not isinstance(p, Parameter):
                raise TypeError(f"ParameterTuple holds Parameters only, but got {type(p)}.")
        return super().__new__(cls, items)
