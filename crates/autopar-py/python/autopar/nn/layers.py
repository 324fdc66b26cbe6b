"""MindSpore's layers, each a Cell over the primitives of ``autopar.ops`` under the attribute
names MindSpore gives them (``fc.matmul``, ``fc.bias_add``), so that ``shard`` reaches them
as in MindSpore."""

import math

import numpy as np

from .. import ops
from ..common import dtype as mstype
from ..common.initializer import HeUniform, Uniform, _materialize
from ..common.parameter import Parameter
from .cell import Cell

__all__ = [
    "Dense", "ReLU", "GELU", "SiLU", "Sigmoid", "Tanh", "Softmax", "LogSoftmax", "Flatten", "Dropout", "Conv2d",
    "MaxPool2d", "AvgPool2d", "BatchNorm2d", "LayerNorm", "Embedding",
]


def _param(init, shape, dtype, name, requires_grad=True):
    return Parameter(_materialize(init, shape, dtype), name=name, requires_grad=requires_grad)


_ACTIVATIONS = {}


def _activation(name):
    if name is None or isinstance(name, Cell):
        return name
    cls = _ACTIVATIONS.get(str(name).lower())
    if cls is None:
        raise ValueError(f"Unknown activation {name!r}; use one of {sorted(_ACTIVATIONS)}.")
    return cls()


class Dense(Cell):
    """``y = activation(x W^T + b)`` with ``weight [out, in]`` (MindSpore's ``nn.Dense``)."""

    def __init__(self, in_channels, out_channels, weight_init=None, bias_init=None, has_bias=True, activation=None, dtype=mstype.float32):
        super().__init__()
        self.in_channels, self.out_channels, self.has_bias = int(in_channels), int(out_channels), bool(has_bias)
        if weight_init is None:
            weight_init = HeUniform(math.sqrt(5))
        self.weight = _param(weight_init, [out_channels, in_channels], dtype, "weight")
        if self.has_bias:
            if bias_init is None:
                bias_init = Uniform(1.0 / math.sqrt(in_channels))
            self.bias = _param(bias_init, [out_channels], dtype, "bias")
            self.bias_add = ops.BiasAdd()
        self.matmul = ops.MatMul(transpose_b=True)
        self.activation = _activation(activation)
        self.activation_flag = self.activation is not None

    def construct(self, x):
        lead = x.shape[:-1]
        if len(x.shape) != 2:
            x = ops.Reshape()(x, (-1, x.shape[-1]))
        x = self.matmul(x, self.weight)
        if self.has_bias:
            x = self.bias_add(x, self.bias)
        if self.activation_flag:
            x = self.activation(x)
        if len(lead) != 1:
            x = ops.Reshape()(x, tuple(lead) + (self.out_channels,))
        return x


class _Act(Cell):
    _prim = None
    _attr = None

    def __init__(self):
        super().__init__()
        setattr(self, self._attr, self._prim())

    def construct(self, x):
        return getattr(self, self._attr)(x)


class ReLU(_Act):
    _prim, _attr = ops.ReLU, "relu"


class GELU(_Act):
    _prim, _attr = ops.GeLU, "gelu"

    def __init__(self, approximate=True):
        if not approximate:
            raise NotImplementedError("autopar's GELU is the tanh approximation (approximate=True).")
        super().__init__()


class SiLU(_Act):
    _prim, _attr = ops.SiLU, "silu"


class Sigmoid(_Act):
    _prim, _attr = ops.Sigmoid, "sigmoid"


class Tanh(_Act):
    _prim, _attr = ops.Tanh, "tanh"


class Flatten(Cell):
    def __init__(self, start_dim=1, end_dim=-1):
        super().__init__()
        if (start_dim, end_dim) != (1, -1):
            raise NotImplementedError("autopar's Flatten keeps the first dimension (start_dim=1, end_dim=-1).")
        self.flatten = ops.Flatten()

    def construct(self, x):
        return self.flatten(x)


class Softmax(Cell):
    def __init__(self, axis=-1):
        super().__init__()
        self.softmax = ops.Softmax(axis)

    def construct(self, x):
        return self.softmax(x)


class LogSoftmax(Cell):
    def __init__(self, axis=-1):
        super().__init__()
        self.log_softmax = ops.LogSoftmax(axis)

    def construct(self, x):
        return self.log_softmax(x)


_ACTIVATIONS.update({"relu": ReLU, "gelu": GELU, "silu": SiLU, "sigmoid": Sigmoid, "tanh": Tanh, "softmax": Softmax})


class Dropout(Cell):
    """Zeroes each element with probability ``p`` (or ``1 - keep_prob``) while training."""

    def __init__(self, keep_prob=None, p=None, dtype=mstype.float32):
        super().__init__()
        if p is None:
            p = 0.5 if keep_prob is None else 1.0 - keep_prob
        if not 0.0 <= p < 1.0:
            raise ValueError(f"For 'Dropout', 'p' must be in [0, 1), but got {p}.")
        self.p = float(p)
        self.dropout = ops.Dropout(1.0 - self.p)

    def construct(self, x):
        if not self.training or self.p == 0.0:
            return x
        return self.dropout(x)[0]


class Conv2d(Cell):
    """MindSpore's ``nn.Conv2d`` (NCHW; ``weight [out, in / group, kh, kw]``)."""

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, pad_mode="same", padding=0, dilation=1, group=1,
                 has_bias=False, weight_init=None, bias_init=None, data_format="NCHW", dtype=mstype.float32):
        super().__init__()
        k = [kernel_size] * 2 if isinstance(kernel_size, int) else list(kernel_size)
        if weight_init is None:
            weight_init = HeUniform(math.sqrt(5))
        self.weight = _param(weight_init, [out_channels, in_channels // group] + k, dtype, "weight")
        self.has_bias = bool(has_bias)
        if self.has_bias:
            fan_in = in_channels // group * k[0] * k[1]
            self.bias = _param(bias_init if bias_init is not None else Uniform(1.0 / math.sqrt(fan_in)), [out_channels], dtype, "bias")
            self.bias_add = ops.BiasAdd()
        self.conv2d = ops.Conv2D(out_channels, k, pad_mode=pad_mode, pad=padding, stride=stride, dilation=dilation, group=group, data_format=data_format)

    def construct(self, x):
        y = self.conv2d(x, self.weight)
        return self.bias_add(y, self.bias) if self.has_bias else y


def _pool_padding(cls, pad_mode, padding):
    if padding and pad_mode.lower() != "pad":
        raise ValueError(f"For '{cls}', 'padding' is used with pad_mode='pad' only, but pad_mode is {pad_mode!r}.")
    return padding


class MaxPool2d(Cell):
    def __init__(self, kernel_size=1, stride=1, pad_mode="valid", padding=0, dilation=1, return_indices=False, ceil_mode=False,
                 data_format="NCHW"):
        super().__init__()
        if dilation != 1 or return_indices or ceil_mode:
            raise NotImplementedError("For 'MaxPool2d', autopar supports dilation=1, return_indices=False and ceil_mode=False.")
        self.max_pool = ops.MaxPool(kernel_size, stride, pad_mode, data_format, _pool_padding("MaxPool2d", pad_mode, padding))

    def construct(self, x):
        return self.max_pool(x)


class AvgPool2d(Cell):
    def __init__(self, kernel_size=1, stride=1, pad_mode="valid", padding=0, ceil_mode=False, count_include_pad=True,
                 divisor_override=None, data_format="NCHW"):
        super().__init__()
        if ceil_mode or divisor_override is not None or (padding and not count_include_pad):
            raise NotImplementedError(
                "For 'AvgPool2d', autopar supports ceil_mode=False, no divisor_override, and padding counted in the average."
            )
        self.avg_pool = ops.AvgPool(kernel_size, stride, pad_mode, data_format, _pool_padding("AvgPool2d", pad_mode, padding))

    def construct(self, x):
        return self.avg_pool(x)


class BatchNorm2d(Cell):
    """MindSpore's ``nn.BatchNorm2d``: batch statistics while training (moving averages kept
    with ``momentum`` as MindSpore weighs them), the moving averages otherwise."""

    def __init__(self, num_features, eps=1e-5, momentum=0.9, affine=True, gamma_init="ones", beta_init="zeros",
                 moving_mean_init="zeros", moving_var_init="ones", use_batch_statistics=None, data_format="NCHW", dtype=mstype.float32):
        super().__init__()
        # In MindSpore's order: the moving statistics first.
        self.moving_mean = _param(moving_mean_init, [num_features], dtype, "mean", False)
        self.moving_variance = _param(moving_var_init, [num_features], dtype, "variance", False)
        self.gamma = _param(gamma_init, [num_features], dtype, "gamma", affine)
        self.beta = _param(beta_init, [num_features], dtype, "beta", affine)
        if data_format != "NCHW":
            raise NotImplementedError(f"For 'BatchNorm2d', autopar computes NCHW, but got data_format={data_format!r}.")
        self.use_batch_statistics = use_batch_statistics
        # As MindSpore builds it: the primitive's momentum is the batch's weight.
        self.bn_train = ops.BatchNorm(True, eps, 1.0 - momentum)
        self.bn_infer = ops.BatchNorm(False, eps, 1.0 - momentum)
        for bn in (self.bn_train, self.bn_infer):
            bn._keep = float(momentum)

    def construct(self, x):
        train = self.training if self.use_batch_statistics is None else self.use_batch_statistics
        bn = self.bn_train if train else self.bn_infer
        return bn(x, self.gamma, self.beta, self.moving_mean, self.moving_variance)[0]


class LayerNorm(Cell):
    def __init__(self, normalized_shape, begin_norm_axis=-1, begin_params_axis=-1, gamma_init="ones", beta_init="zeros", epsilon=1e-7, dtype=mstype.float32):
        super().__init__()
        shape = list(normalized_shape)
        self.gamma = _param(gamma_init, shape, dtype, "gamma")
        self.beta = _param(beta_init, shape, dtype, "beta")
        self.layer_norm = ops.LayerNorm(begin_norm_axis, begin_params_axis, epsilon)

    def construct(self, x):
        return self.layer_norm(x, self.gamma, self.beta)[0]


class Embedding(Cell):
    """MindSpore's ``nn.Embedding``, built as MindSpore builds it: the ids flattened
    (``reshape_flat``), the rows gathered (or a one-hot product, ``use_one_hot``), then
    reshaped to ``ids.shape + (embedding_size,)``, so MindSpore's strategies fit its primitives."""

    def __init__(self, vocab_size, embedding_size, use_one_hot=False, embedding_table="normal", dtype=mstype.int32, padding_idx=None):
        super().__init__()
        if padding_idx is not None:
            raise NotImplementedError("autopar's Embedding has no padding_idx yet.")
        self.vocab_size, self.embedding_size, self.use_one_hot = int(vocab_size), int(embedding_size), bool(use_one_hot)
        self.embedding_table = _param(embedding_table, [vocab_size, embedding_size], mstype.float32, "embedding_table")
        self.reshape_flat = ops.Reshape()
        self.gather = ops.Gather()
        self.one_hot = ops.OneHot()
        self.array_mul = ops.MatMul()
        self.reshape = ops.Reshape()

    def construct(self, ids):
        out_shape = tuple(ids.shape) + (self.embedding_size,)
        flat_ids = self.reshape_flat(ids, (-1,))
        if self.use_one_hot:
            rows = self.array_mul(self.one_hot(flat_ids, self.vocab_size, 1.0, 0.0), self.embedding_table)
        else:
            rows = self.gather(self.embedding_table, flat_ids, 0)
        return self.reshape(rows, out_shape)


del np
