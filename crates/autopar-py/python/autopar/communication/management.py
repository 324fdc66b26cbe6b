"""``mindspore.communication.management``: the same functions as ``autopar.communication``."""

from . import GlobalComm, get_group_size, get_local_rank, get_local_rank_size, get_rank, init, release  # noqa: F401
