"""``mindspore.dataset.vision.c_transforms`` (MindSpore 1.x's module): the same operations as
``autopar.dataset.vision``."""

from . import HWC2CHW, Inter, Normalize, RandomCrop, RandomHorizontalFlip, Rescale, Resize  # noqa: F401
