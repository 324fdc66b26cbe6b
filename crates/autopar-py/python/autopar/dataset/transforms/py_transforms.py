"""``mindspore.dataset.transforms.py_transforms`` (MindSpore 1.x's module): ``TypeCast``, ``Compose``."""

from . import Compose, TypeCast  # noqa: F401
