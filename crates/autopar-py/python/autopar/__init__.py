"""autopar: distributed, automatically parallel deep-learning training, from Python.

The parts of ``mindspore`` that MindSpore's parallel documents use, under the same names, so
that a script runs with ``import mindspore`` changed to ``import autopar``: ``Tensor``,
``Parameter``, dtypes, ``nn`` (cells, layers, losses, optimizers), ``ops`` (primitives with
``shard``), ``train`` (``Model``, callbacks), ``dataset``, ``communication``, the contexts,
and the checkpoint functions. A network's ``construct`` is traced into autopar's graph and
trained by autopar's engine, on ``device_num`` simulated devices of this process.

``autopar.cli`` runs the ``autopar plan`` / ``autopar train`` command lines from Python.
"""

from ._native import __version__
from . import _context
from ._context import (
    GRAPH_MODE,
    PYNATIVE_MODE,
    ParallelMode,
    get_auto_parallel_context,
    get_context,
    get_seed,
    reset_auto_parallel_context,
    set_auto_parallel_context,
    set_context,
    set_seed,
)
from .common import dtype
from .common.dtype import bfloat16, bool_, float16, float32, float64, int8, int16, int32, int64, uint8
from .common.initializer import initializer
from .common.parameter import Parameter, ParameterTuple
from .common.tensor import Tensor
from .checkpoint import (
    CheckpointReader,
    load_distributed_checkpoint,
    load_segmented_checkpoints,
    merge_pipeline_strategys,
    rank_list_for_transform,
    transform_checkpoint_by_rank,
    transform_checkpoints,
)
from . import amp, cli, common, communication, context, dataset, nn, ops, parallel, train
from .amp import DynamicLossScaleManager, FixedLossScaleManager, LossScaleManager
from .train.serialization import load_checkpoint, load_param_into_net, save_checkpoint
from .train.model import Model
from .parallel import Layout, parameter_broadcast, sync_pipeline_shared_parameters
from ._functional import grad, value_and_grad


def _functional_training(name):
    def refused(*args, **kwargs):
        raise NotImplementedError(
            f"autopar does not run MindSpore's functional training ({name}) yet: train with mindspore.train.Model or a "
            "TrainOneStepCell(WithLossCell(net, loss), optimizer) called on tensors, which autopar compiles and runs on its devices."
        )

    refused.__name__ = name
    return refused


jit = _functional_training("jit")


def lazy_inline(fn=None, policies=None):
    """MindSpore's ``@lazy_inline`` (a compile-time hint): autopar compiles the cell as it is."""
    if fn is None:
        return lambda f: f
    return fn

__all__ = [
    "__version__",
    "GRAPH_MODE", "PYNATIVE_MODE", "ParallelMode", "get_auto_parallel_context", "get_context", "get_seed",
    "reset_auto_parallel_context", "set_auto_parallel_context", "set_context", "set_seed",
    "dtype", "bfloat16", "bool_", "float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8",
    "initializer", "lazy_inline", "value_and_grad", "grad", "jit", "Parameter", "ParameterTuple", "Tensor", "Model",
    "CheckpointReader", "load_checkpoint", "load_distributed_checkpoint", "load_segmented_checkpoints", "load_param_into_net",
    "merge_pipeline_strategys", "rank_list_for_transform", "save_checkpoint", "transform_checkpoint_by_rank",
    "transform_checkpoints", "Layout", "parameter_broadcast", "sync_pipeline_shared_parameters",
    "DynamicLossScaleManager", "FixedLossScaleManager", "LossScaleManager",
    "amp", "cli", "common", "communication", "context", "dataset", "nn", "ops", "parallel", "train",
]
