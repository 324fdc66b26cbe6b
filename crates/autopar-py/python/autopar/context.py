"""``mindspore.context`` (MindSpore 1.x's module): the contexts and ``ParallelMode``."""

from ._context import (  # noqa: F401
    GRAPH_MODE,
    PYNATIVE_MODE,
    ParallelMode,
    get_auto_parallel_context,
    get_context,
    reset_auto_parallel_context,
    set_auto_parallel_context,
    set_context,
)
