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
    """The parallel context a job is planned under, as JSON: the auto-parallel context, and the
    search's algorithm and cost-model parameters the script set, which only auto_parallel's
    search reads (MindSpore ignores them in the other modes)."""
    ctx = dict(_SEARCH) if str(_PARALLEL.get("parallel_mode", "")) == "auto_parallel" else {}
    ctx.update(_PARALLEL)
    ctx["device_num"] = _device_num()
    return json.dumps(ctx)


# ``set_algo_parameters`` / ``set_cost_model_context``: what the script set (each reset apart
# from the auto-parallel context, as MindSpore keeps them), and MindSpore 2.10's defaults.
_SEARCH = {}
_ALGO_DEFAULTS = {"fully_use_devices": False, "elementwise_op_strategy_follow": False, "tensor_slice_align_enable": False,
                  "tensor_slice_align_size": 16, "enable_algo_approxi": False, "algo_approxi_epsilon": 0.1}
_COST_DEFAULTS = {"device_memory_capacity": float(16 << 30), "costmodel_alpha": 1.0, "costmodel_beta": 400.0, "costmodel_gamma": 0.001,
                  "costmodel_communi_threshold": 2048.0, "costmodel_communi_const": 3072.0, "costmodel_communi_bias": 1024.0}
# Keys autopar's search takes only at MindSpore's default (its cost model's constants; it
# searches exactly, without approximation).
_FIXED = {"enable_algo_approxi", "algo_approxi_epsilon", "costmodel_communi_threshold", "costmodel_communi_const", "costmodel_communi_bias"}


def _set_search(caller, defaults, kwargs):
    trial = dict(_SEARCH)
    for key, value in kwargs.items():
        if key not in defaults:
            raise ValueError(f"For '{caller}', the keyword argument '{key}' is not recognized; expected one of {sorted(defaults)}")
        value = _plain(value)
        if key in _FIXED:
            if value != defaults[key]:
                raise ValueError(f"For '{caller}', '{key}' = {value!r} is not supported: autopar's search keeps MindSpore's "
                                 f"default {defaults[key]!r} (it searches exactly, with MindSpore's latency constants)")
            continue
        trial[key] = value
    try:
        _native.check_parallel_context(json.dumps(trial))
    except ValueError as e:
        raise ValueError(f"For '{caller}': {e}") from None
    _SEARCH.clear()
    _SEARCH.update(trial)


def _get_search(caller, defaults, key):
    if key not in defaults:
        raise ValueError(f"For '{caller}', the keyword argument '{key}' is not recognized; expected one of {sorted(defaults)}")
    return _SEARCH.get(key, defaults[key])


def set_algo_parameters(**kwargs):
    """MindSpore's ``mindspore.parallel.set_algo_parameters``: the strategy search's algorithm
    parameters (``fully_use_devices``, ``elementwise_op_strategy_follow``,
    ``tensor_slice_align_enable``, ``tensor_slice_align_size``; ``enable_algo_approxi`` and
    ``algo_approxi_epsilon`` only at their defaults)."""
    _set_search("set_algo_parameters", _ALGO_DEFAULTS, kwargs)


def get_algo_parameters(attr_key):
    """MindSpore's ``get_algo_parameters``: the value set, else MindSpore 2.10's default."""
    return _get_search("get_algo_parameters", _ALGO_DEFAULTS, attr_key)


def reset_algo_parameters():
    """MindSpore's ``reset_algo_parameters``."""
    for key in _ALGO_DEFAULTS:
        _SEARCH.pop(key, None)


def set_cost_model_context(**kwargs):
    """MindSpore's ``_cost_model_context.set_cost_model_context``: ``device_memory_capacity``
    and the objective's weights ``costmodel_alpha``, ``costmodel_beta``, ``costmodel_gamma``
    (dynamic_programming optimises MindSpore's cost model with them); the latency constants
    only at their defaults."""
    _set_search("set_cost_model_context", _COST_DEFAULTS, kwargs)


def get_cost_model_context(attr_key):
    """MindSpore's ``get_cost_model_context``: the value set, else MindSpore 2.10's default."""
    return _get_search("get_cost_model_context", _COST_DEFAULTS, attr_key)


def reset_cost_model_context():
    """MindSpore's ``reset_cost_model_context``."""
    for key in _COST_DEFAULTS:
        _SEARCH.pop(key, None)
