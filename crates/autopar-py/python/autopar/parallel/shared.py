"""MindSpore's ``sync_pipeline_shared_parameters(net)``.

A parameter used on several pipeline stages has one value in a network of this process; the
job cuts every stage's copy from it, and its gradients are summed over the stages each step,
so the copies stay equal: nothing is left to synchronise."""

__all__ = ["sync_pipeline_shared_parameters"]


def sync_pipeline_shared_parameters(net):
    from ..nn.cell import Cell

    if not isinstance(net, Cell):
        raise TypeError(f"For 'sync_pipeline_shared_parameters', 'net' must be a Cell, but got {type(net)}.")
