"""MindSpore's dynamic learning rates: lists with a learning rate per step, which the
optimizers take as ``learning_rate``."""

import math

__all__ = ["piecewise_constant_lr", "exponential_decay_lr", "cosine_decay_lr", "warmup_lr"]


def _positive(name, value):
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"'{name}' must be a positive int, but got {value!r}.")


def piecewise_constant_lr(milestone, learning_rates):
    if len(milestone) != len(learning_rates):
        raise ValueError("For 'piecewise_constant_lr', 'milestone' and 'learning_rates' must have the same length.")
    lr, last = [], 0
    for i, item in enumerate(milestone):
        _positive(f"milestone[{i}]", item)
        if item < last:
            raise ValueError(f"For 'piecewise_constant_lr', milestone[{i}] must be greater than milestone[{i - 1}].")
        lr += [float(learning_rates[i])] * (item - last)
        last = item
    return lr


def exponential_decay_lr(learning_rate, decay_rate, total_step, step_per_epoch, decay_epoch, is_stair=False):
    for name, v in (("total_step", total_step), ("step_per_epoch", step_per_epoch), ("decay_epoch", decay_epoch)):
        _positive(name, v)
    lr = []
    for i in range(total_step):
        epochs = math.floor(i / step_per_epoch) / decay_epoch
        lr.append(learning_rate * decay_rate ** (math.floor(epochs) if is_stair else epochs))
    return lr


def cosine_decay_lr(min_lr, max_lr, total_step, step_per_epoch, decay_epoch):
    for name, v in (("total_step", total_step), ("step_per_epoch", step_per_epoch), ("decay_epoch", decay_epoch)):
        _positive(name, v)
    if min_lr >= max_lr:
        raise ValueError(f"For 'cosine_decay_lr', the 'max_lr' must be greater than the 'min_lr', but got {max_lr} and {min_lr}.")
    delta = 0.5 * (max_lr - min_lr)
    lr = []
    for i in range(total_step):
        epoch = min(math.floor(i / step_per_epoch), decay_epoch)
        lr.append(min_lr + delta * (1 + math.cos(math.pi * epoch / decay_epoch)))
    return lr


def warmup_lr(learning_rate, total_step, step_per_epoch, warmup_epoch):
    for name, v in (("total_step", total_step), ("step_per_epoch", step_per_epoch), ("warmup_epoch", warmup_epoch)):
        _positive(name, v)
    return [learning_rate * min(warmup_epoch, math.floor(i / step_per_epoch)) / warmup_epoch for i in range(total_step)]
