"""MindSpore's optimizers. Each describes its rule and hyper-parameters; autopar's engine
applies it on every rank to the rank's own slices (MindSpore's formulas: Momentum's
``v = mu v + g; p -= lr v``, Adam with bias correction, AdamWeightDecay without)."""

import numbers

import numpy as np

from ..common.parameter import Parameter, ParameterTuple

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


def _learning_rate(cls, value, what="learning_rate"):
    """A learning rate as a list: one value, or one per step (MindSpore's dynamic learning rate)."""
    from ..common.tensor import Tensor

    if isinstance(value, Tensor):
        value = value.asnumpy()
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if isinstance(value, (list, tuple)):
        if not value:
            raise ValueError(f"For '{cls}', '{what}' must not be an empty list.")
        return [_number(cls, f"{what}[{i}]", v) for i, v in enumerate(value)]
    from .learning_rate_schedule import LearningRateSchedule

    if isinstance(value, LearningRateSchedule):
        return _Scheduled(value.rates())
    if hasattr(value, "construct"):
        raise NotImplementedError(
            f"For '{cls}', autopar takes a learning rate as a number, a list per step or one of nn's LearningRateSchedule "
            f"cells (ExponentialDecayLR, NaturalExpDecayLR, InverseDecayLR, CosineDecayLR, PolynomialDecayLR, WarmUpLR), "
            f"not {type(value).__name__}."
        )
    return [_number(cls, what, value)]


class _Scheduled(list):
    """The rates of a LearningRateSchedule cell per step (its last one after the list: no run is
    too long for it)."""


class Optimizer:
    """The parameters an optimizer updates, its learning rate (a number, or a list per step)
    and hyper-parameters, and MindSpore's parameter groups (``params``, ``lr``,
    ``weight_decay``; ``order_params`` accepted)."""

    _kind = None
    # The names MindSpore gives the optimizer's state of a parameter ("moments." + its name).
    _state_prefixes = []

    def __init__(self, learning_rate, parameters, weight_decay=0.0, loss_scale=1.0):
        cls = type(self).__name__
        items = list(parameters)
        if not items:
            raise ValueError(f"For '{cls}', the argument 'parameters' must not be empty.")
        if isinstance(loss_scale, bool) or not isinstance(loss_scale, (int, float)) or not 0 < loss_scale < float("inf"):
            raise ValueError(f"For '{cls}', 'loss_scale' must be a positive finite number, but got {loss_scale!r}.")
        # Gradients divided by it: only as the partner of FixedLossScaleManager(S, drop_overflow_update=False),
        # whose scale the engine divides out itself (checked by Model).
        self.loss_scale = float(loss_scale)
        self.learning_rate = _learning_rate(cls, learning_rate)
        self.weight_decay = _number(cls, "weight_decay", weight_decay)
        self.groups = []
        if isinstance(items[0], dict):
            params, seen = [], set()
            for k, group in enumerate(items):
                if not isinstance(group, dict):
                    raise TypeError(f"For '{cls}', parameter groups must all be dicts, but group {k} is {type(group)}.")
                if "order_params" in group:
                    continue
                for key in group:
                    if key not in ("params", "lr", "weight_decay", "grad_centralization"):
                        raise ValueError(f"For '{cls}', group {k} has the key {key!r}; use 'params', 'lr', 'weight_decay' or 'order_params'.")
                if group.get("grad_centralization"):
                    raise NotImplementedError(f"For '{cls}', autopar has no gradient centralization (group {k}).")
                members = list(group["params"])
                for p in members:
                    if not isinstance(p, Parameter):
                        raise TypeError(f"For '{cls}', group {k}'s 'params' must be Parameters, but got {type(p)}.")
                    if id(p) in seen:
                        raise RuntimeError(f"For 'Optimizer', the {p.name} parameter already exists, it does not support repeated setting.")
                    seen.add(id(p))
                lr = _learning_rate(cls, group["lr"], f"lr of group {k}") if "lr" in group else None
                wd = _number(cls, f"weight_decay of group {k}", group["weight_decay"]) if "weight_decay" in group else self.weight_decay
                self.groups.append((members, lr, wd))
                params += members
        else:
            params = items
        for p in params:
            if not isinstance(p, Parameter):
                raise TypeError(f"For '{cls}', every element of 'parameters' must be a Parameter, but got {type(p)}.")
        self.parameters = ParameterTuple(params)
        # value_and_grad(fn, None, optimizer.parameters) finds the optimizer through them.
        self.parameters._optimizer = self
        self.hyper = {"weight_decay": self.weight_decay}

    def __call__(self, gradients):
        """Applies ``gradients`` (those of ``value_and_grad``'s function, or values computed from
        them) to the parameters, on the devices the gradients' job runs on."""
        from .._functional import apply_gradients

        if not apply_gradients(self, gradients):
            raise RuntimeError(
                f"For '{type(self).__name__}', autopar applies gradients of a function value_and_grad (or grad) returned, over "
                "these parameters; compute the gradients that way first (or train with Model or a TrainOneStepCell)."
            )
        return True

    def _checkpoint_extra(self, steps):
        """What MindSpore's checkpoint of this optimizer holds beside the state the engine keeps,
        after ``steps`` updates: ``global_step``, ``learning_rate`` (the list of a dynamic rate;
        none for a schedule cell, which MindSpore does not save)."""
        lr = self.learning_rate
        extra = {"global_step": np.array([steps], np.int32)}
        if not isinstance(lr, _Scheduled):
            extra["learning_rate"] = np.array(lr[0] if len(lr) == 1 else list(lr), np.float32)
        return extra

    def _kept_prefixes(self):
        """The prefixes of the state the engine keeps (of ``_state_prefixes``, in its order)."""
        return list(self._state_prefixes)

    def _load_state(self, parameter_dict):
        """``load_param_into_net(optimizer, parameter_dict)``: the state entries of its parameters
        (MindSpore's names, ``moments.w``) and ``global_step``, given to the ranks of the job it
        next updates; returns (its entries not found, the dict's entries used)."""
        state, used, missing = {}, set(), []
        for prefix in self._kept_prefixes():
            for p in self.parameters:
                key = prefix + p.name
                if key in parameter_dict:
                    value = np.asarray(parameter_dict[key].asnumpy() if hasattr(parameter_dict[key], "asnumpy") else parameter_dict[key])
                    if tuple(value.shape) != tuple(p.shape):
                        raise RuntimeError(
                            f"For 'load_param_into_net', {key} has shape {tuple(value.shape)}, but the parameter {p.name} {tuple(p.shape)}."
                        )
                    state[key] = value
                    used.add(key)
                else:
                    missing.append(key)
        steps = None  # without global_step the optimizer keeps its count, as MindSpore's
        if "global_step" in parameter_dict:
            g = parameter_dict["global_step"]
            steps = int(np.asarray(g.asnumpy() if hasattr(g, "asnumpy") else g).ravel()[0])
            used.add("global_step")
        self.__dict__["_pending_state"] = (state, steps)
        return missing, used

    def _groups_wire(self):
        """The groups as the engine takes them: (names, learning rate or None, weight decay)."""
        return [([p.name for p in members], lr, wd) for members, lr, wd in self.groups]

    def get_lr(self):
        return self.learning_rate[0] if len(self.learning_rate) == 1 else list(self.learning_rate)


class SGD(Optimizer):
    _kind = "SGD"
    _state_prefixes = ["accum.", "stat."]

    def _kept_prefixes(self):
        # The engine keeps the momentum buffer (MindSpore's accum) when there is a momentum.
        return ["accum."] if self.hyper.get("momentum", 0.0) > 0 else []

    def _checkpoint_extra(self, steps):
        extra = super()._checkpoint_extra(steps)
        extra["momentum"] = np.array(self.hyper.get("momentum", 0.0), np.float32)
        for p in self.parameters:
            # MindSpore's first-step flag: 1 until the first update, 0 after.
            extra["stat." + p.name] = np.full(p.shape, 0.0 if steps else 1.0, np.float32)
            if not self._kept_prefixes():
                extra["accum." + p.name] = np.zeros(p.shape, np.float32)
        return extra

    def __init__(self, params, learning_rate=0.1, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False, loss_scale=1.0):
        super().__init__(learning_rate, params, weight_decay, loss_scale)
        if dampening != 0.0:
            raise NotImplementedError("For 'SGD', autopar supports dampening=0.0 only.")
        if nesterov and momentum <= 0.0:
            raise ValueError(f"For 'SGD', if 'nesterov' is true, 'momentum' must be > 0.0, but got {momentum}.")
        self.hyper.update(momentum=_number("SGD", "momentum", momentum), nesterov=float(bool(nesterov)))


class Momentum(Optimizer):
    _kind = "Momentum"
    _state_prefixes = ["moments."]

    def _checkpoint_extra(self, steps):
        extra = super()._checkpoint_extra(steps)
        extra["momentum"] = np.array(self.hyper["momentum"], np.float32)
        return extra

    def __init__(self, params, learning_rate, momentum, weight_decay=0.0, loss_scale=1.0, use_nesterov=False):
        super().__init__(learning_rate, params, weight_decay, loss_scale)
        self.hyper.update(momentum=_number("Momentum", "momentum", momentum), nesterov=float(bool(use_nesterov)))


class Adam(Optimizer):
    _kind = "Adam"
    _state_prefixes = ["moment1.", "moment2."]

    def _checkpoint_extra(self, steps):
        extra = super()._checkpoint_extra(steps)
        # Scalars, as MindSpore 2.10's checkpoints hold them.
        extra["beta1_power"] = np.array(np.float32(self.hyper["beta1"]) ** steps, np.float32)
        extra["beta2_power"] = np.array(np.float32(self.hyper["beta2"]) ** steps, np.float32)
        return extra

    def __init__(self, params, learning_rate=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, use_locking=False, use_nesterov=False,
                 weight_decay=0.0, loss_scale=1.0, use_amsgrad=False, **kwargs):
        super().__init__(learning_rate, params, 0.0, loss_scale)
        if weight_decay != 0.0 or any(wd for _, _, wd in self.groups):
            raise NotImplementedError("For 'Adam', autopar has no L2 weight decay in Adam yet: use AdamWeightDecay.")
        if use_nesterov or use_amsgrad:
            raise NotImplementedError("For 'Adam', autopar supports use_nesterov=False and use_amsgrad=False only.")
        self.hyper.update(beta1=_number("Adam", "beta1", beta1), beta2=_number("Adam", "beta2", beta2), eps=_number("Adam", "eps", eps))


class AdamWeightDecay(Optimizer):
    _kind = "AdamWeightDecay"
    _state_prefixes = ["adam_m.", "adam_v."]

    def __init__(self, params, learning_rate=1e-3, beta1=0.9, beta2=0.999, eps=1e-6, weight_decay=0.0):
        super().__init__(learning_rate, params, weight_decay)
        self.hyper.update(beta1=_number("AdamWeightDecay", "beta1", beta1), beta2=_number("AdamWeightDecay", "beta2", beta2),
                          eps=_number("AdamWeightDecay", "eps", eps))
