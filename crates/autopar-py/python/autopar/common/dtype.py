"""MindSpore's data types (``mindspore.float32``, ``mindspore.dtype.int32``, ...), each with its
numpy counterpart."""

import numpy as np

__all__ = [
    "Type",
    "bool_",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "float16",
    "float32",
    "float64",
    "bfloat16",
    "float_",
    "int_",
    "to_numpy",
    "from_numpy",
]


class Type:
    """A MindSpore dtype: its name (``Float32``) and the numpy dtype its values are held in."""

    def __init__(self, name, numpy_dtype):
        self._name = name
        self._numpy = np.dtype(numpy_dtype)

    def __repr__(self):
        return self._name

    __str__ = __repr__

    def __eq__(self, other):
        return isinstance(other, Type) and other._name == self._name

    def __hash__(self):
        return hash(self._name)


bool_ = Type("Bool", np.bool_)
int8 = Type("Int8", np.int8)
int16 = Type("Int16", np.int16)
int32 = Type("Int32", np.int32)
int64 = Type("Int64", np.int64)
uint8 = Type("UInt8", np.uint8)
float16 = Type("Float16", np.float16)
float32 = Type("Float32", np.float32)
float64 = Type("Float64", np.float64)
# numpy has no bfloat16: its values are held as float32 here.
bfloat16 = Type("BFloat16", np.float32)
float_ = float32
int_ = int64

_ALL = [bool_, int8, int16, int32, int64, uint8, float16, float32, float64]
_BY_NUMPY = {t._numpy: t for t in _ALL}


def to_numpy(dtype):
    """The numpy dtype of ``dtype`` (a MindSpore dtype, a numpy dtype or a Python type)."""
    if isinstance(dtype, Type):
        return dtype._numpy
    if dtype is float:
        return np.dtype(np.float32)
    if dtype is int:
        return np.dtype(np.int64)
    if dtype is bool:
        return np.dtype(np.bool_)
    try:
        return np.dtype(dtype)
    except TypeError:
        raise TypeError(f"{dtype!r} is not a data type; use one of mindspore's (float32, int32, ...).") from None


def from_numpy(numpy_dtype):
    """The MindSpore dtype of a numpy dtype."""
    t = _BY_NUMPY.get(np.dtype(numpy_dtype))
    if t is None:
        raise TypeError(f"numpy dtype {numpy_dtype} has no MindSpore counterpart.")
    return t
