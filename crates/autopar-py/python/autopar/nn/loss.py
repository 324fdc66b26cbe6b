"""MindSpore's losses as Cells over ``autopar.ops``."""

from .. import ops
from ..common import dtype as mstype
from .cell import Cell

__all__ = ["LossBase", "SoftmaxCrossEntropyWithLogits", "CrossEntropyLoss", "MSELoss", "L1Loss"]


def _check_reduction(cls, reduction):
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"For '{cls}', 'reduction' must be 'mean', 'sum' or 'none', but got {reduction!r}.")
    return reduction


class LossBase(Cell):
    """A loss whose per-element values are reduced by ``reduction``."""

    def __init__(self, reduction="mean"):
        super().__init__()
        self.reduction = _check_reduction(type(self).__name__, reduction)
        self.reduce_mean = ops.ReduceMean()
        self.reduce_sum = ops.ReduceSum()

    def get_loss(self, x, weights=1.0):
        if self.reduction == "mean":
            return self.reduce_mean(x, ())
        if self.reduction == "sum":
            return self.reduce_sum(x, ())
        return x


class SoftmaxCrossEntropyWithLogits(LossBase):
    """Softmax cross-entropy of ``logits [N, C]`` against class indices (``sparse=True``) or
    one-hot / soft labels ``[N, C]``."""

    def __init__(self, sparse=False, reduction="none"):
        super().__init__(reduction)
        self.sparse = bool(sparse)
        self.sparse_softmax_cross_entropy = ops.SparseSoftmaxCrossEntropyWithLogits()
        self.softmax_cross_entropy = ops.SoftmaxCrossEntropyWithLogits()
        self.one_hot = ops.OneHot()

    def construct(self, logits, labels):
        if self.sparse:
            if self.reduction == "mean":
                return self.sparse_softmax_cross_entropy(logits, labels)
            labels = self.one_hot(labels, logits.shape[-1], 1.0, 0.0)
        x = self.softmax_cross_entropy(logits, labels)[0]
        return self.get_loss(x)


class CrossEntropyLoss(LossBase):
    """Cross-entropy of ``logits [N, C]`` against class indices ``[N]`` or probabilities ``[N, C]``."""

    def __init__(self, weight=None, ignore_index=-100, reduction="mean", label_smoothing=0.0):
        super().__init__(reduction)
        if weight is not None or label_smoothing != 0.0 or ignore_index != -100:
            raise NotImplementedError("autopar's CrossEntropyLoss takes no class weights, label smoothing or ignore_index yet.")
        self.loss = SoftmaxCrossEntropyWithLogits(sparse=True, reduction=reduction)
        self.dense = SoftmaxCrossEntropyWithLogits(sparse=False, reduction=reduction)

    def construct(self, logits, labels):
        if len(labels.shape) == len(logits.shape):
            return self.dense(logits, labels)
        return self.loss(logits, labels)


class MSELoss(LossBase):
    def __init__(self, reduction="mean"):
        super().__init__(reduction)
        self.sub = ops.Sub()
        self.square = ops.Mul()

    def construct(self, logits, labels):
        d = self.sub(logits, labels)
        return self.get_loss(self.square(d, d))


class L1Loss(LossBase):
    def __init__(self, reduction="mean"):
        super().__init__(reduction)
        raise NotImplementedError("autopar has no absolute-value op yet: L1Loss is not supported.")


del mstype
