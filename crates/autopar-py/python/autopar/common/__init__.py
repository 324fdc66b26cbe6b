"""``mindspore.common``: dtypes, ``Tensor``, ``Parameter`` and the initializers."""

from . import dtype, initializer
from .parameter import Parameter, ParameterTuple
from .tensor import Tensor

__all__ = ["dtype", "initializer", "Parameter", "ParameterTuple", "Tensor"]
