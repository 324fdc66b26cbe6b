"""MindSpore's ``dataset.transforms``: ``TypeCast`` and ``Compose``."""

import numpy as np

from ...common import dtype as mstype

__all__ = ["TypeCast", "Compose"]


class TypeCast:
    def __init__(self, data_type):
        self.dtype = mstype.to_numpy(data_type)

    def __call__(self, x):
        return np.asarray(x).astype(self.dtype)


class Compose:
    def __init__(self, transforms):
        self.transforms = list(transforms)

    def __call__(self, *x):
        for t in self.transforms:
            x = t(*x)
            x = x if isinstance(x, tuple) else (x,)
        return x if len(x) > 1 else x[0]
