"""MindSpore's initializers (``initializer("normal", shape, dtype)``, ``Normal(sigma)``, ...):
values drawn with numpy from the seed ``set_seed`` gave."""

import math

import numpy as np

from . import dtype as mstype

__all__ = [
    "Initializer",
    "initializer",
    "Zero",
    "One",
    "Constant",
    "Normal",
    "TruncatedNormal",
    "Uniform",
    "XavierUniform",
    "XavierNormal",
    "HeUniform",
    "HeNormal",
]


def _rng():
    from .. import _context

    return _context._numpy_rng()


def _fans(shape):
    if len(shape) < 2:
        n = shape[0] if shape else 1
        return n, n
    receptive = int(np.prod(shape[2:])) if len(shape) > 2 else 1
    return shape[1] * receptive, shape[0] * receptive


class Initializer:
    """A rule that fills a tensor of a given shape."""

    def _fill(self, shape):
        raise NotImplementedError


class Zero(Initializer):
    def _fill(self, shape):
        return np.zeros(shape)


class One(Initializer):
    def _fill(self, shape):
        return np.ones(shape)


class Constant(Initializer):
    def __init__(self, value):
        self.value = value

    def _fill(self, shape):
        return np.full(shape, self.value, dtype=np.float64)


class Normal(Initializer):
    def __init__(self, sigma=0.01, mean=0.0):
        self.sigma, self.mean = sigma, mean

    def _fill(self, shape):
        return _rng().normal(self.mean, self.sigma, shape)


class TruncatedNormal(Initializer):
    def __init__(self, sigma=0.01, mean=0.0, a=-2.0, b=2.0):
        self.sigma, self.mean, self.a, self.b = sigma, mean, a, b

    def _fill(self, shape):
        out = _rng().normal(self.mean, self.sigma, shape)
        bad = (out < self.a) | (out > self.b)
        while bad.any():
            out[bad] = _rng().normal(self.mean, self.sigma, int(bad.sum()))
            bad = (out < self.a) | (out > self.b)
        return out


class Uniform(Initializer):
    def __init__(self, scale=0.07):
        self.scale = scale

    def _fill(self, shape):
        return _rng().uniform(-self.scale, self.scale, shape)


class XavierUniform(Initializer):
    def __init__(self, gain=1):
        self.gain = gain

    def _fill(self, shape):
        fan_in, fan_out = _fans(shape)
        bound = self.gain * math.sqrt(6.0 / (fan_in + fan_out))
        return _rng().uniform(-bound, bound, shape)


class XavierNormal(Initializer):
    def __init__(self, gain=1):
        self.gain = gain

    def _fill(self, shape):
        fan_in, fan_out = _fans(shape)
        return _rng().normal(0.0, self.gain * math.sqrt(2.0 / (fan_in + fan_out)), shape)


def _gain(nonlinearity, a):
    if nonlinearity == "leaky_relu":
        return math.sqrt(2.0 / (1 + a * a))
    return {"relu": math.sqrt(2.0), "tanh": 5.0 / 3, "linear": 1.0, "sigmoid": 1.0}.get(nonlinearity, 1.0)


class HeUniform(Initializer):
    def __init__(self, negative_slope=0, mode="fan_in", nonlinearity="leaky_relu"):
        self.a, self.mode, self.nonlinearity = negative_slope, mode, nonlinearity

    def _fill(self, shape):
        fan_in, fan_out = _fans(shape)
        fan = fan_in if self.mode == "fan_in" else fan_out
        bound = _gain(self.nonlinearity, self.a) * math.sqrt(3.0 / fan)
        return _rng().uniform(-bound, bound, shape)


class HeNormal(Initializer):
    def __init__(self, negative_slope=0, mode="fan_in", nonlinearity="leaky_relu"):
        self.a, self.mode, self.nonlinearity = negative_slope, mode, nonlinearity

    def _fill(self, shape):
        fan_in, fan_out = _fans(shape)
        fan = fan_in if self.mode == "fan_in" else fan_out
        return _rng().normal(0.0, _gain(self.nonlinearity, self.a) / math.sqrt(fan), shape)


_BY_NAME = {
    "zeros": Zero,
    "zero": Zero,
    "ones": One,
    "one": One,
    "normal": Normal,
    "truncatednormal": TruncatedNormal,
    "uniform": Uniform,
    "xavier_uniform": XavierUniform,
    "xavieruniform": XavierUniform,
    "xavier_normal": XavierNormal,
    "he_uniform": HeUniform,
    "heuniform": HeUniform,
    "he_normal": HeNormal,
    "henormal": HeNormal,
}


def _materialize(init, shape, dtype):
    """A numpy array of ``shape`` and ``dtype`` filled by ``init`` (a name, an Initializer, a
    number, a numpy array or a Tensor)."""
    from .tensor import Tensor

    shape = tuple(int(s) for s in ([shape] if isinstance(shape, int) else shape))
    np_dtype = mstype.to_numpy(dtype)
    if isinstance(init, Tensor):
        init = init.asnumpy()
    if isinstance(init, np.ndarray):
        if tuple(init.shape) != shape:
            raise ValueError(f"The initial value has shape {tuple(init.shape)}, but the shape is {shape}.")
        return init.astype(np_dtype)
    if isinstance(init, (int, float)) and not isinstance(init, bool):
        return np.full(shape, init, dtype=np_dtype)
    if isinstance(init, str):
        rule = _BY_NAME.get(init.lower())
        if rule is None:
            raise ValueError(f"Unknown initializer {init!r}; use one of {sorted(_BY_NAME)}.")
        init = rule()
    if not isinstance(init, Initializer):
        raise TypeError(f"'init' must be a name, an Initializer, a number or a Tensor, but got {type(init)}.")
    return np.asarray(init._fill(shape), dtype=np_dtype)


def initializer(init, shape=None, dtype=mstype.float32):
    """MindSpore's ``initializer(init, shape, dtype)``: a Tensor filled by ``init``."""
    from .tensor import Tensor

    if shape is None:
        if isinstance(init, (Tensor, np.ndarray)):
            shape = tuple(np.asarray(init).shape)
        else:
            raise ValueError("initializer needs 'shape' unless 'init' is a tensor.")
    return Tensor(_materialize(init, shape, dtype))
