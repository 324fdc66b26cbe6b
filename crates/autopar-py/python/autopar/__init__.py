"""autopar: distributed, automatically parallel deep-learning training, from Python.

MindSpore's distributed-checkpoint functions with MindSpore's signatures (change one import:
``import autopar as ms``), reading and writing ``.ckpt`` / safetensors as numpy arrays, and
``plan`` / ``train`` driving the autopar engine with the command line's options as keyword
arguments.
"""

from ._native import __version__
from .checkpoint import (
    CheckpointReader,
    load_checkpoint,
    load_distributed_checkpoint,
    load_segmented_checkpoints,
    merge_pipeline_strategys,
    rank_list_for_transform,
    save_checkpoint,
    transform_checkpoint_by_rank,
    transform_checkpoints,
)
from . import parallel
from .run import command_line, plan, train

__all__ = [
    "__version__",
    "CheckpointReader",
    "load_checkpoint",
    "load_distributed_checkpoint",
    "load_segmented_checkpoints",
    "merge_pipeline_strategys",
    "rank_list_for_transform",
    "save_checkpoint",
    "transform_checkpoint_by_rank",
    "transform_checkpoints",
    "parallel",
    "plan",
    "train",
    "command_line",
]
