"""MindSpore's global settings: ``set_context``, ``set_seed``, and the parallel context
(``set_auto_parallel_context``), whose options autopar's engine reads with MindSpore's names
and checks as they are set."""

import json
import os

import numpy as np

from . import _native

__all__ = [
    "GRAPH_MODE",
    "PYNATIVE_MODE",
    "ParallelMode",
    "set_context",
    "get_context",
    "set_seed",
    "get_seed",
    "set_auto_parallel_context",
    "get_auto_parallel_context",
    "reset_auto_parallel_context",
]

GRAPH_MODE = 0
PYNATIVE_MODE = 1


class ParallelMode:
    """The values of ``parallel_mode``."""

    STAND_ALONE = "stand_alone"
    DATA_PARALLEL = "data_parallel"
    HYBRID_PARALLEL = "hybrid_parallel"
    SEMI_AUTO_PARALLEL = "semi_auto_parallel"
    AUTO_PARALLEL = "auto_parallel"
    MODE_LIST = [STAND_ALONE, DATA_PARALLEL, HYBRID_PARALLEL, SEMI_AUTO_PARALLEL, AUTO_PARALLEL]


_CONTEXT = {"mode": GRAPH_MODE, "device_target": "CPU", "device_id": 0}
_PARALLEL = {}
_SEED = {"seed": None, "rng": None}


def set_context(**kwargs):
    """Accepts MindSpore's ``set_context`` options. autopar always compiles ``construct`` into a
    graph (GRAPH_MODE) and runs on its own devices, so ``mode``, ``device_target`` and the memory
    options are recorded; an option it does not know is a ``ValueError``."""
    known = {
        "mode", "device_target", "device_id", "max_device_memory", "save_graphs", "save_graphs_path",
        "jit_config", "jit_syntax_level", "memory_optimize_level", "max_call_depth", "deterministic",
        "pynative_synchronize", "runtime_num_threads", "enable_graph_kernel", "variable_memory_max_size",
        "mempool_block_size", "ascend_config", "print_file_path", "env_config_path", "enable_reduce_precision",
        "reserve_class_name_in_scope", "enable_compile_cache", "compile_cache_path", "inter_op_parallel_num",
    }
    for key, value in kwargs.items():
        if key not in known:
            raise ValueError(f"For 'set_context', the keyword argument {key} is not recognized!")
        if key == "mode" and value not in (GRAPH_MODE, PYNATIVE_MODE):
            raise ValueError(f"For 'set_context', 'mode' must be GRAPH_MODE (0) or PYNATIVE_MODE (1), but got {value!r}.")
        _CONTEXT[key] = value


def get_context(attr_key):
    if attr_key not in _CONTEXT:
        raise ValueError(f"For 'get_context', the keyword argument {attr_key} is not set or not recognized.")
    return _CONTEXT[attr_key]


def set_seed(seed):
    """The global seed: parameters made by initializers and the datasets' shuffles draw from it."""
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise ValueError(f"The argument 'seed' must be a non-negative int, but got {seed!r}.")
    _SEED["seed"] = seed
    _SEED["rng"] = np.random.default_rng(seed)


def get_seed():
    return _SEED["seed"]


def _numpy_rng():
    if _SEED["rng"] is None:
        _SEED["rng"] = np.random.default_rng()
    return _SEED["rng"]


def _plain(value):
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def set_auto_parallel_context(**kwargs):
    """MindSpore's ``set_auto_parallel_context``: every option by its name, checked now by
    autopar's engine (an unknown option or a bad value is a ``ValueError`` naming it)."""
    trial = dict(_PARALLEL)
    for key, value in kwargs.items():
        trial[key] = _plain(value)
    try:
        _native.check_parallel_context(json.dumps(trial))
    except ValueError as e:
        raise ValueError(f"For 'set_auto_parallel_context': {e}") from None
    _PARALLEL.clear()
    _PARALLEL.update(trial)


def get_auto_parallel_context(attr_key):
    defaults = {"device_num": _device_num(), "global_rank": 0, "parallel_mode": ParallelMode.STAND_ALONE, "gradients_mean": False,
                "full_batch": False, "pipeline_stages": 1, "enable_parallel_optimizer": False, "search_mode": "recursive_programming"}
    if attr_key in _PARALLEL:
        return _PARALLEL[attr_key]
    if attr_key in defaults:
        return defaults[attr_key]
    raise ValueError(f"For 'get_auto_parallel_context', the keyword argument {attr_key} is not set or not recognized.")


def reset_auto_parallel_context():
    _PARALLEL.clear()


def _device_num():
    """The devices of a job: ``device_num`` when set, else the launcher's ``RANK_SIZE``, else 1."""
    if "device_num" in _PARALLEL:
        return int(_PARALLEL["device_num"])
    size = os.environ.get("RANK_SIZE")
    return int(size) if size and size.isdigit() and int(size) > 0 else 1


def _job_context():
    """The parallel context a job is planned under, as JSON."""
    ctx = dict(_PARALLEL)
    ctx["device_num"] = _device_num()
    return json.dumps(ctx)
