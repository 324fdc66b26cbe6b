"""MindSpore's ``mindspore.train.loss_scale_manager`` (the managers of ``autopar.amp``)."""

from ..amp import DynamicLossScaleManager, FixedLossScaleManager, LossScaleManager

__all__ = ["LossScaleManager", "FixedLossScaleManager", "DynamicLossScaleManager"]
