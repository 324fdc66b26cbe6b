"""MindSpore's ``mindspore.train``: ``Model``, the callbacks and serialization."""

from ._callback import Callback, CheckpointConfig, LossMonitor, ModelCheckpoint, RunContext, TimeMonitor
from . import loss_scale_manager
from .loss_scale_manager import DynamicLossScaleManager, FixedLossScaleManager, LossScaleManager
from .model import Model
from .serialization import load_checkpoint, load_param_into_net, save_checkpoint

__all__ = [
    "Model", "DynamicLossScaleManager", "FixedLossScaleManager", "LossScaleManager", "Callback", "CheckpointConfig", "LossMonitor", "ModelCheckpoint", "RunContext", "TimeMonitor",
    "load_checkpoint", "load_param_into_net", "save_checkpoint",
]
