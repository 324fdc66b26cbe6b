"""MindSpore's ``communication``: ``init``, ``get_rank``, ``get_group_size``.

Without a launcher, one Python process runs every rank of a job as simulated devices:
``get_group_size()`` is the job's device count (``device_num``, else ``RANK_SIZE``) and
``get_rank()`` is 0, the rank whose view ``Model``'s callbacks see."""

from .. import _context

__all__ = ["init", "release", "get_rank", "get_group_size", "get_local_rank", "get_local_rank_size", "GlobalComm"]

_STATE = {"inited": False}


class GlobalComm:
    BACKEND = "autopar"
    WORLD_COMM_GROUP = "hccl_world_group"
    INITED = False


def init(backend_name=None):
    _STATE["inited"] = True
    GlobalComm.INITED = True


def release():
    _STATE["inited"] = False
    GlobalComm.INITED = False


def _check():
    if not _STATE["inited"]:
        raise RuntimeError("Call mindspore.communication.init() before asking for ranks.")


def get_rank(group=None):
    _check()
    return 0


def get_local_rank(group=None):
    return get_rank(group)


def get_group_size(group=None):
    _check()
    return _context._device_num()


def get_local_rank_size(group=None):
    return get_group_size(group)
