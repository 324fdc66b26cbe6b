"""MindSpore's ``nn``: ``Cell``, layers, losses, optimizers and the training wrappers."""

from .cell import Cell, CellList, SequentialCell
from .layers import (
    AvgPool2d, BatchNorm2d, Conv2d, Dense, Dropout, Embedding, Flatten, GELU, LayerNorm, LogSoftmax, MaxPool2d, ReLU, SiLU,
    Sigmoid, Softmax, Tanh,
)
from .dynamic_lr import cosine_decay_lr, exponential_decay_lr, piecewise_constant_lr, warmup_lr
from .learning_rate_schedule import (
    CosineDecayLR, ExponentialDecayLR, InverseDecayLR, LearningRateSchedule, NaturalExpDecayLR, PolynomialDecayLR, WarmUpLR,
)
from .loss import CrossEntropyLoss, L1Loss, LossBase, MSELoss, SoftmaxCrossEntropyWithLogits
from .metrics import Accuracy, Loss, Metric, Top1CategoricalAccuracy, Top5CategoricalAccuracy, TopKCategoricalAccuracy
from .optim import SGD, Adam, AdamWeightDecay, Momentum, Optimizer
from .wrap import (
    DistributedGradReducer,
    GradAccumulationCell,
    MicroBatchInterleaved,
    PipelineCell,
    TrainOneStepCell,
    TrainOneStepWithLossScaleCell,
    WithEvalCell,
    WithLossCell,
)

__all__ = [
    "Cell", "CellList", "SequentialCell", "LearningRateSchedule", "ExponentialDecayLR", "NaturalExpDecayLR",
    "InverseDecayLR", "CosineDecayLR", "PolynomialDecayLR", "WarmUpLR", "AvgPool2d", "BatchNorm2d", "Conv2d", "Dense", "Dropout", "Embedding", "Flatten",
    "GELU", "LayerNorm", "LogSoftmax", "MaxPool2d", "ReLU", "SiLU", "Sigmoid", "Softmax", "Tanh", "CrossEntropyLoss",
    "L1Loss", "LossBase", "MSELoss", "SoftmaxCrossEntropyWithLogits", "SGD", "Adam", "AdamWeightDecay", "Momentum",
    "Optimizer", "Accuracy", "Loss", "Metric", "Top1CategoricalAccuracy", "Top5CategoricalAccuracy", "TopKCategoricalAccuracy",
    "DistributedGradReducer", "TrainOneStepCell", "TrainOneStepWithLossScaleCell", "PipelineCell", "GradAccumulationCell", "MicroBatchInterleaved", "cosine_decay_lr", "exponential_decay_lr", "piecewise_constant_lr", "warmup_lr", "WithEvalCell", "WithLossCell",
]
