"""MindSpore's ``mindspore.amp``: the loss-scale managers for ``Model(..., loss_scale_manager=...)``,
and the functional pieces for loops of one's own (``auto_mixed_precision``,
``StaticLossScaler``, ``DynamicLossScaler``, ``all_finite``).

The loss is scaled by autopar's engine (``autopar train --loss-scale``): the backward pass is
seeded with the loss times the scale, the gradients are multiplied by its reciprocal before
they are synchronised, and a step whose gradients overflow (an infinity or a NaN on any
device) is skipped on every device; a dynamic scale is then divided by its factor, and
multiplied by it after ``scale_window`` steps without an overflow, as MindSpore's
``DynamicLossScaleUpdateCell`` does.

In a loop of one's own, ``auto_mixed_precision(net, "O2")`` makes the jobs that run ``net``
(``value_and_grad``'s functions, the network called on values) compute under that precision
policy, with float32 parameters; a loss scaler scales the loss inside the forward function and
unscales the loss and the gradients after it, ``all_finite`` reads the gradients to check them,
and ``adjust`` moves a dynamic scale as MindSpore's does."""

__all__ = [
    "LossScaleManager", "FixedLossScaleManager", "DynamicLossScaleManager", "LossScaler", "StaticLossScaler",
    "DynamicLossScaler", "all_finite", "auto_mixed_precision",
]


def _positive(cls, name, value, least):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= least or value != value or value == float("inf"):
        raise ValueError(f"For '{cls}', '{name}' must be a finite number of at least {least}, but got {value!r}.")
    return float(value)


class LossScaleManager:
    """The base of MindSpore's loss-scale managers."""

    def get_loss_scale(self):
        raise NotImplementedError

    def _engine_form(self):
        raise NotImplementedError


class FixedLossScaleManager(LossScaleManager):
    """``FixedLossScaleManager(loss_scale=128.0, drop_overflow_update=True)``: a constant scale; a step
    whose gradients overflow is skipped (``drop_overflow_update``) or applied as it is."""

    def __init__(self, loss_scale=128.0, drop_overflow_update=True):
        self._loss_scale = _positive("FixedLossScaleManager", "loss_scale", loss_scale, 1)
        self._drop_overflow_update = bool(drop_overflow_update)

    def get_loss_scale(self):
        return self._loss_scale

    def get_drop_overflow_update(self):
        return self._drop_overflow_update

    def update_loss_scale(self, overflow):
        """A fixed scale does not change."""

    def _engine_form(self):
        return f"fixed:{self._loss_scale!r}" + ("" if self._drop_overflow_update else ":keep")


class DynamicLossScaleManager(LossScaleManager):
    """``DynamicLossScaleManager(init_loss_scale=2**24, scale_factor=2, scale_window=2000)``: overflowed
    steps skipped and the scale divided by ``scale_factor`` (not below 1); multiplied by it after
    ``scale_window`` steps in a row without an overflow."""

    def __init__(self, init_loss_scale=2**24, scale_factor=2, scale_window=2000):
        self._init = _positive("DynamicLossScaleManager", "init_loss_scale", init_loss_scale, 1)
        factor = _positive("DynamicLossScaleManager", "scale_factor", scale_factor, 1)
        if factor <= 1:
            raise ValueError(f"For 'DynamicLossScaleManager', 'scale_factor' must be greater than 1, but got {scale_factor!r}.")
        if isinstance(scale_window, bool) or not isinstance(scale_window, int) or scale_window < 1:
            raise ValueError(f"For 'DynamicLossScaleManager', 'scale_window' must be a positive int, but got {scale_window!r}.")
        self._factor, self._window = factor, scale_window
        self._loss_scale = self._init

    def get_loss_scale(self):
        """The scale of the last step trained (the initial one before training)."""
        return self._loss_scale

    def get_drop_overflow_update(self):
        return True

    def _engine_form(self):
        return f"dynamic:{self._init!r}:{self._factor!r}:{self._window}"


def auto_mixed_precision(network, amp_level="O0", dtype=None):
    """MindSpore's ``auto_mixed_precision(network, amp_level, dtype=float16)``: ``network`` (the
    same cell) computing under the precision policy ``amp_level`` (O0-O3, as ``Model``'s) in
    ``dtype`` (float16 or bfloat16) wherever autopar compiles it: the jobs of
    ``value_and_grad``'s functions that call it, and the network called on values."""
    from .common import dtype as mstype
    from .nn.cell import Cell
    from .train.model import _amp

    if not isinstance(network, Cell):
        raise TypeError(f"For 'auto_mixed_precision', 'network' must be a Cell, but got {type(network).__name__}.")
    level, half = _amp(amp_level, {"cast_model_type": mstype.float16 if dtype is None else dtype})
    network.__dict__["_amp"] = (level, half)
    return network


def _values(inputs):
    """``inputs`` (a tensor, or a tuple or list of them) as numpy arrays, and a function giving
    back the same structure from arrays."""
    import numpy as np

    from .common.tensor import Tensor

    single = not isinstance(inputs, (tuple, list))
    items = [inputs] if single else list(inputs)
    arrays = [np.asarray(t.asnumpy() if isinstance(t, Tensor) else t) for t in items]

    def back(values):
        out = [Tensor(v) for v in values]
        return out[0] if single else tuple(out)

    return arrays, back


def all_finite(inputs):
    """MindSpore's ``amp.all_finite``: whether every value of ``inputs`` (tensors, e.g. the
    gradients, read whole) is finite."""
    import numpy as np

    from .common.tensor import Tensor

    arrays, _ = _values(inputs)
    return Tensor(np.array(all(bool(np.isfinite(a).all()) for a in arrays)))


class LossScaler:
    """The base of MindSpore's loss scalers: ``scale`` and ``unscale`` tensors by the scale."""

    def __init__(self, scale_value):
        self.scale_value = _positive(type(self).__name__, "scale_value", scale_value, 1)

    def scale(self, inputs):
        """``inputs`` times the scale (inside a forward function too)."""
        from .common.tensor import Tensor

        if isinstance(inputs, Tensor) and inputs._is_traced():
            return inputs * self.scale_value
        if isinstance(inputs, (tuple, list)) and inputs and isinstance(inputs[0], Tensor) and inputs[0]._is_traced():
            return tuple(t * self.scale_value for t in inputs)
        arrays, back = _values(inputs)
        return back([a * a.dtype.type(self.scale_value) if a.dtype.kind == "f" else a * self.scale_value for a in arrays])

    def unscale(self, inputs):
        """``inputs`` (the loss, the gradients) divided by the scale."""
        arrays, back = _values(inputs)
        return back([a / a.dtype.type(self.scale_value) if a.dtype.kind == "f" else a / self.scale_value for a in arrays])

    def adjust(self, grads_finite):
        raise NotImplementedError


class StaticLossScaler(LossScaler):
    """MindSpore's ``StaticLossScaler(scale_value)``: a constant scale."""

    def adjust(self, grads_finite):
        return False


class DynamicLossScaler(LossScaler):
    """MindSpore's ``DynamicLossScaler(scale_value, scale_factor, scale_window)``: after
    ``scale_window`` finite steps in a row the scale is multiplied by ``scale_factor`` (when the
    product is finite); after a step that is not, divided by it (not below 1)."""

    def __init__(self, scale_value, scale_factor, scale_window):
        super().__init__(scale_value)
        self.scale_factor = _positive("DynamicLossScaler", "scale_factor", scale_factor, 1)
        if isinstance(scale_window, bool) or not isinstance(scale_window, int) or scale_window < 1:
            raise ValueError(f"For 'DynamicLossScaler', 'scale_window' must be a positive int, but got {scale_window!r}.")
        self.scale_window = scale_window
        self.counter = 0

    def adjust(self, grads_finite):
        import math

        import numpy as np

        finite = bool(np.asarray(grads_finite.asnumpy() if hasattr(grads_finite, "asnumpy") else grads_finite))
        if finite:
            if self.counter == self.scale_window - 1:
                grown = self.scale_value * self.scale_factor
                if math.isfinite(grown):
                    self.scale_value = grown
            self.counter = (self.counter + 1) % self.scale_window
        else:
            self.scale_value = max(1.0, self.scale_value / self.scale_factor)
            self.counter = 0
        return True
