"""MindSpore's optimizers. Each describes its rule and hyper-parameters; autopar's engine
applies it on every rank to the rank's own slices (MindSpore's formulas: Momentum's
``v = mu v + g; p -= lr v``, Adam with bias correction, AdamWeightDecay without)."""

import numbers

from ..common.parameter import Parameter

__all__ = ["Optimizer", "SGD", "Momentum", "Adam", "AdamWeightDecay"]


def _number(cls, what, value, low=0.0):
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        raise TypeError(
            f"For '{cls}', '{what}' must be a float, but got {type(value).__name__}: autopar takes a constant "
            "learning rate and hyper-parameters here (schedules and per-step lists are not supported yet)."
        )
    if value < low:
        raise ValueError(f"For '{cls}', '{what}' must be at least {low}, but got {value}.")
    return float(value)


class Optimizer:
    """The parameters an optimizer updates and its hyper-parameters."""

    _kind = None

    def __init__(self, learning_rate, parameters, weight_decay=0.0, loss_scale=1.0):
        cls = type(self).__name__
        params = list(parameters)
        if not params:
            raise ValueError(f"For '{cls}', the argument 'parameters' must not be empty.")
        if isinstance(params[0], dict):
            raise NotImplementedError(f"For '{cls}', parameter groups are not supported by autopar yet: pass a list of Parameters.")
        for p in params:
            if not isinstance(p, Parameter):
                raise TypeError(f"For '{cls}', every element of 'parameters' must be a Parameter, but got {type(p)}.")
        if loss_scale != 1.0:
            raise NotImplementedError(f"For '{cls}', autopar has no loss scaling yet (loss_scale must be 1.0).")
        self.parameters = params
        self.learning_rate = _number(cls, "learning_rate", learning_rate)
        self.weight_decay = _number(cls, "weight_decay", weight_decay)
        self.hyper = {"learning_rate": self.learning_rate, "weight_decay": self.weight_decay}

    def get_lr(self):
        return self.learning_rate


class SGD(Optimizer):
    _kind = "SGD"

    def __init__(self, params, learning_rate=0.1, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False, loss_scale=1.0):
        super().__init__(learning_rate, params, weight_decay, loss_scale)
        if dampening != 0.0:
            raise NotImplementedError("For 'SGD', autopar supports dampening=0.0 only.")
        self.hyper.update(momentum=_number("SGD", "momentum", momentum), nesterov=float(bool(nesterov)))


class Momentum(Optimizer):
    _kind = "Momentum"

    def __init__(self, params, learning_rate, momentum, weight_decay=0.0, loss_scale=1.0, use_nesterov=False):
        super().__init__(learning_rate, params, weight_decay, loss_scale)
        self.hyper.update(momentum=_number("Momentum", "momentum", momentum), nesterov=float(bool(use_nesterov)))


class Adam(Optimizer):
    _kind = "Adam"

    def __init__(self, params, learning_rate=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, use_locking=False, use_nesterov=False,
                 weight_decay=0.0, loss_scale=1.0, use_amsgrad=False, **kwargs):
        super().__init__(learning_rate, params, 0.0, loss_scale)
        if weight_decay != 0.0:
            raise NotImplementedError("For 'Adam', autopar has no L2 weight decay in Adam yet: use AdamWeightDecay.")
        if use_nesterov or use_amsgrad:
            raise NotImplementedError("For 'Adam', autopar supports use_nesterov=False and use_amsgrad=False only.")
        self.hyper.update(beta1=_number("Adam", "beta1", beta1), beta2=_number("Adam", "beta2", beta2), eps=_number("Adam", "eps", eps))


class AdamWeightDecay(Optimizer):
    _kind = "AdamWeightDecay"

    def __init__(self, params, learning_rate=1e-3, beta1=0.9, beta2=0.999, eps=1e-6, weight_decay=0.0):
        super().__init__(learning_rate, params, weight_decay)
        self.hyper.update(beta1=_number("AdamWeightDecay", "beta1", beta1), beta2=_number("AdamWeightDecay", "beta2", beta2),
                          eps=_number("AdamWeightDecay", "eps", eps))
