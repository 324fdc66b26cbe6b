"""MindSpore's learning-rate schedule cells (``nn.LearningRateSchedule``): an optimizer given
one takes the rate of each step from it, step ``s`` (from 0) using ``schedule(s)``. The engine
takes the rates as a list per step ([`Optimizer`]'s dynamic learning rate), computed up to the
step where the schedule stops changing, or the first ``HORIZON`` steps of one that never stops
(its last rate after)."""

import math

import numpy as np

from .cell import Cell

__all__ = [
    "LearningRateSchedule", "ExponentialDecayLR", "NaturalExpDecayLR", "InverseDecayLR", "CosineDecayLR",
    "PolynomialDecayLR", "WarmUpLR",
]

# The steps of a schedule that never stops changing given to the engine (its last rate after).
HORIZON = 100_000


def _positive_int(cls, name, value):
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"For '{cls}', '{name}' must be a positive int, but got {value!r}.")
    return value


def _float(cls, name, value, positive=False):
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"For '{cls}', '{name}' must be a float, but got {type(value).__name__}.")
    if positive and not value > 0:
        raise ValueError(f"For '{cls}', '{name}' must be positive, but got {value}.")
    return float(value)


class LearningRateSchedule(Cell):
    """A learning rate as a function of the global step."""

    # Steps after which the rate no longer changes (None: it always does).
    _settles = None

    def rate(self, step):
        """The learning rate of step ``step`` (from 0)."""
        raise NotImplementedError(f"{type(self).__name__} does not define its rate.")

    def rates(self):
        """The rates per step the engine takes: up to the step the schedule settles at, or
        ``HORIZON`` steps."""
        steps = HORIZON if self._settles is None else self._settles + 1
        return [self.rate(s) for s in range(steps)]

    def construct(self, global_step):
        from ..common.tensor import Tensor

        step = np.asarray(global_step.asnumpy() if isinstance(global_step, Tensor) else global_step)
        return Tensor(np.array(self.rate(int(step)), dtype=np.float32))

    def __call__(self, global_step):
        return self.construct(global_step)


class _Decay(LearningRateSchedule):
    """A rate decaying from ``learning_rate`` at ``decay_rate`` per ``decay_steps`` (in stairs
    with ``is_stair``)."""

    def __init__(self, learning_rate, decay_rate, decay_steps, is_stair=False):
        super().__init__()
        cls = type(self).__name__
        self.learning_rate = _float(cls, "learning_rate", learning_rate, True)
        self.decay_rate = _float(cls, "decay_rate", decay_rate, True)
        self.decay_steps = _positive_int(cls, "decay_steps", decay_steps)
        self.is_stair = bool(is_stair)


class ExponentialDecayLR(_Decay):
    """``learning_rate * decay_rate ** p``, ``p = step / decay_steps`` (floored with ``is_stair``)."""

    def rate(self, step):
        p = step / self.decay_steps
        return self.learning_rate * self.decay_rate ** (math.floor(p) if self.is_stair else p)


class NaturalExpDecayLR(_Decay):
    """``learning_rate * exp(-decay_rate * p)``: MindSpore's ``p`` is the step itself (with
    ``is_stair``, floored to a multiple of ``decay_steps``)."""

    def rate(self, step):
        p = (step // self.decay_steps) * self.decay_steps if self.is_stair else step
        return self.learning_rate * math.exp(-self.decay_rate * p)


class InverseDecayLR(_Decay):
    """``learning_rate / (1 + decay_rate * p)``, ``p = step / decay_steps`` (floored with ``is_stair``)."""

    def rate(self, step):
        p = step / self.decay_steps
        return self.learning_rate / (1 + self.decay_rate * (math.floor(p) if self.is_stair else p))


class CosineDecayLR(LearningRateSchedule):
    """``min_lr + (max_lr - min_lr) (1 + cos(pi s / decay_steps)) / 2``, ``s`` the step up to ``decay_steps``."""

    def __init__(self, min_lr, max_lr, decay_steps):
        super().__init__()
        cls = type(self).__name__
        self.min_lr = _float(cls, "min_lr", min_lr)
        self.max_lr = _float(cls, "max_lr", max_lr, True)
        if self.min_lr < 0 or self.min_lr >= self.max_lr:
            raise ValueError(f"For '{cls}', 'min_lr' must be in [0, max_lr), but got {min_lr} with max_lr {max_lr}.")
        self.decay_steps = _positive_int(cls, "decay_steps", decay_steps)
        self._settles = self.decay_steps

    def rate(self, step):
        s = min(step, self.decay_steps)
        return self.min_lr + 0.5 * (self.max_lr - self.min_lr) * (1 + math.cos(math.pi * s / self.decay_steps))


class PolynomialDecayLR(LearningRateSchedule):
    """``(learning_rate - end_learning_rate) (1 - s / d) ** power + end_learning_rate``: ``s``
    the step up to ``d = decay_steps``, or with ``update_decay_steps`` ``d`` the next multiple of
    ``decay_steps`` at or above the step."""

    def __init__(self, learning_rate, end_learning_rate, decay_steps, power, update_decay_steps=False):
        super().__init__()
        cls = type(self).__name__
        self.learning_rate = _float(cls, "learning_rate", learning_rate, True)
        self.end_learning_rate = _float(cls, "end_learning_rate", end_learning_rate)
        self.decay_steps = _positive_int(cls, "decay_steps", decay_steps)
        self.power = _float(cls, "power", power, True)
        self.update_decay_steps = bool(update_decay_steps)
        self._settles = None if self.update_decay_steps else self.decay_steps

    def rate(self, step):
        if self.update_decay_steps:
            d, s = self.decay_steps * max(math.ceil(step / self.decay_steps), 1), step
        else:
            d, s = self.decay_steps, min(step, self.decay_steps)
        return (self.learning_rate - self.end_learning_rate) * (1 - s / d) ** self.power + self.end_learning_rate


class WarmUpLR(LearningRateSchedule):
    """``learning_rate * min(step, warmup_steps) / warmup_steps`` (step 0's rate is 0)."""

    def __init__(self, learning_rate, warmup_steps):
        super().__init__()
        cls = type(self).__name__
        self.learning_rate = _float(cls, "learning_rate", learning_rate, True)
        self.warmup_steps = _positive_int(cls, "warmup_steps", warmup_steps)
        self._settles = self.warmup_steps

    def rate(self, step):
        return self.learning_rate * min(step, self.warmup_steps) / self.warmup_steps
