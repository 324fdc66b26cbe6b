"""``mindspore.parallel``: the checkpoint functions (``from autopar.parallel import
rank_list_for_transform`` for ``from mindspore.parallel import ...``), ``parameter_broadcast``
``sync_pipeline_shared_parameters`` and ``Layout``."""

from ..checkpoint import (
    load_distributed_checkpoint,
    load_segmented_checkpoints,
    merge_pipeline_strategys,
    rank_list_for_transform,
    transform_checkpoint_by_rank,
    transform_checkpoints,
)
from .layout import Layout
from .parameter_broadcast import parameter_broadcast
from .shared import sync_pipeline_shared_parameters

__all__ = [
    "Layout",
    "load_distributed_checkpoint",
    "load_segmented_checkpoints",
    "merge_pipeline_strategys",
    "rank_list_for_transform",
    "transform_checkpoint_by_rank",
    "transform_checkpoints",
    "parameter_broadcast",
    "sync_pipeline_shared_parameters",
]
