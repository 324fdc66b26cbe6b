"""``mindspore.parallel``: the checkpoint functions (``from autopar.parallel import
rank_list_for_transform`` for ``from mindspore.parallel import ...``), ``parameter_broadcast``
``sync_pipeline_shared_parameters``, ``Layout`` and the strategy search's algorithm parameters
(``set_algo_parameters``; the cost model's are in ``_cost_model_context``, as in MindSpore)."""

from ..checkpoint import (
    load_distributed_checkpoint,
    load_segmented_checkpoints,
    merge_pipeline_strategys,
    rank_list_for_transform,
    transform_checkpoint_by_rank,
    transform_checkpoints,
)
from .._context import get_algo_parameters, reset_algo_parameters, set_algo_parameters
from . import _cost_model_context
from .layout import Layout
from .parameter_broadcast import parameter_broadcast
from .shared import sync_pipeline_shared_parameters

__all__ = [
    "Layout",
    "get_algo_parameters",
    "reset_algo_parameters",
    "set_algo_parameters",
    "load_distributed_checkpoint",
    "load_segmented_checkpoints",
    "merge_pipeline_strategys",
    "rank_list_for_transform",
    "transform_checkpoint_by_rank",
    "transform_checkpoints",
    "parameter_broadcast",
    "sync_pipeline_shared_parameters",
]
