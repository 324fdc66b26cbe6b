"""MindSpore's ``parameter_broadcast(net, layout, cur_rank=0, initial_rank=0)``.

Its checks are MindSpore's (each a ``ValueError``). Among simulated devices of one process a
network's parameter has one value, which every rank's slices are cut from when a job starts
or the value changes, so the replicas along the data-parallel dimension are equal already:
nothing is left to send."""

from .. import _context

__all__ = ["parameter_broadcast"]


def parameter_broadcast(net, layout, cur_rank=0, initial_rank=0):
    from ..nn.cell import Cell

    if not isinstance(net, Cell):
        raise TypeError(f"For 'parameter_broadcast', 'net' must be a Cell, but got {type(net)}.")
    if not isinstance(layout, dict):
        raise TypeError(f"For 'parameter_broadcast', 'layout' must be a dict, but got {type(layout)}.")
    n = _context._device_num()
    if not isinstance(cur_rank, int) or not 0 <= cur_rank < n:
        raise ValueError(f"For 'parameter_broadcast', cur_rank {cur_rank!r} is not a rank of this job of {n} devices.")
    stages = int(_context._PARALLEL.get("pipeline_stages", 1) or 1)
    per_stage = max(n // stages, 1)
    if not isinstance(initial_rank, int) or initial_rank != (cur_rank // per_stage) * per_stage:
        raise ValueError(
            f"For 'parameter_broadcast', initial_rank {initial_rank!r} is not the first rank of rank {cur_rank}'s pipeline stage "
            f"({(cur_rank // per_stage) * per_stage})."
        )
    names = net.parameters_dict()
    for name in layout:
        if name not in names and not name.startswith(("moments.", "accum.", "stat.", "moment1.", "moment2.", "adam_m.", "adam_v.", "accu_grads.")):
            raise ValueError(f"For 'parameter_broadcast', the parameter {name} of 'layout' is not in the network's parameters_dict().")
