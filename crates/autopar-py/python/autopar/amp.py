"""MindSpore's ``mindspore.amp`` loss-scale managers, for ``Model(..., loss_scale_manager=...)``.

The loss is scaled by autopar's engine (``autopar train --loss-scale``): the backward pass is
seeded with the loss times the scale, the gradients are multiplied by its reciprocal before
they are synchronised, and a step whose gradients overflow (an infinity or a NaN on any
device) is skipped on every device; a dynamic scale is then divided by its factor, and
multiplied by it after ``scale_window`` steps without an overflow, as MindSpore's
``DynamicLossScaleUpdateCell`` does. Mixed precision (``amp_level`` other than ``"O0"``) is not
available yet."""

__all__ = ["LossScaleManager", "FixedLossScaleManager", "DynamicLossScaleManager"]


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
