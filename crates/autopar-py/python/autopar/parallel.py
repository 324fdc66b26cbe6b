"""``mindspore.parallel``'s checkpoint functions under the same module path:
``from autopar.parallel import rank_list_for_transform`` for ``from mindspore.parallel import ...``."""

from .checkpoint import (
    load_distributed_checkpoint,
    load_segmented_checkpoints,
    merge_pipeline_strategys,
    rank_list_for_transform,
    transform_checkpoint_by_rank,
    transform_checkpoints,
)

__all__ = [
    "load_distributed_checkpoint",
    "load_segmented_checkpoints",
    "merge_pipeline_strategys",
    "rank_list_for_transform",
    "transform_checkpoint_by_rank",
    "transform_checkpoints",
]
