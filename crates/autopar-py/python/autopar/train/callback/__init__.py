"""``mindspore.train.callback``: the callbacks (``from mindspore.train.callback import LossMonitor``)."""

from .._callback import Callback, CheckpointConfig, LossMonitor, ModelCheckpoint, RunContext, TimeMonitor  # noqa: F401
