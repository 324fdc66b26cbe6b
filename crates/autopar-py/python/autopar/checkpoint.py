"""MindSpore's distributed-checkpoint API, backed by autopar.

The functions of ``mindspore.parallel.checkpoint_transform`` (``transform_checkpoints``,
``transform_checkpoint_by_rank``, ``rank_list_for_transform``, ``merge_pipeline_strategys``,
``load_segmented_checkpoints``) and ``mindspore.load_checkpoint`` / ``save_checkpoint``, with
MindSpore's signatures, defaults and exceptions, so that a script changes one import::

    import autopar as ms          # was: import mindspore as ms
    ms.transform_checkpoints("src", "dst", "net_", "src_strategy.ckpt", "dst_strategy.ckpt")

Differences, all deliberate:

* Tensors come back as numpy arrays, not ``Parameter`` objects (no MindSpore needed).
  ``BFloat16`` tensors, which numpy lacks, come back as exact ``float32`` copies.
* Transforms stream slices from memory-mapped source files to the destination: memory stays
  bounded by one destination tensor per job, whatever the checkpoint size.
* Loading into a network (``net=...``) and decryption (``dec_key``/``enc_key``) need MindSpore;
  they are refused with a ``ValueError`` instead of being ignored.
"""

import glob
import os
import tempfile

import numpy as np

from . import _native

__all__ = [
    "transform_checkpoints",
    "transform_checkpoint_by_rank",
    "rank_list_for_transform",
    "merge_pipeline_strategys",
    "load_segmented_checkpoints",
    "load_checkpoint",
    "save_checkpoint",
    "load_distributed_checkpoint",
    "CheckpointReader",
]

CheckpointReader = _native.CheckpointReader

# MindSpore dtype names <-> numpy dtypes. BFloat16 has no numpy dtype: read as float32.
_TO_NUMPY = {
    "Bool": np.bool_,
    "Int8": np.int8,
    "Int16": np.int16,
    "Int32": np.int32,
    "Int64": np.int64,
    "UInt8": np.uint8,
    "UInt16": np.uint16,
    "UInt32": np.uint32,
    "UInt64": np.uint64,
    "Float16": np.float16,
    "Float32": np.float32,
    "Float64": np.float64,
}
_FROM_NUMPY = {np.dtype(v): k for k, v in _TO_NUMPY.items()}


def _check_strategy(arg, value):
    if value is not None and not isinstance(value, (str, os.PathLike)):
        raise TypeError(f"The {arg} should be a str, but got {type(value)}.")
    if value is not None:
        value = os.fspath(value)
        folder = os.path.dirname(value)
        if folder and not os.path.exists(folder):
            raise ValueError(f"The director of {arg}: {folder} is not exists.")
    return value


def _check_rank(rank_id):
    if not isinstance(rank_id, int) or isinstance(rank_id, bool):
        raise TypeError("The rank_id should be a int.")
    if rank_id < 0:
        raise ValueError(f"The rank_id should be non-negative, but got {rank_id}.")
    if rank_id >= 2**32:
        raise ValueError(f"The rank_id {rank_id} is beyond any job (devices are at most 4096).")


def _progress():
    return os.environ.get("AUTOPAR_PROGRESS", "1") != "0"


def rank_list_for_transform(rank_id, src_strategy_file=None, dst_strategy_file=None):
    """The source ranks whose checkpoints rank ``rank_id`` of the destination strategy needs,
    highest first (MindSpore's list, rank for rank)."""
    _check_rank(rank_id)
    if src_strategy_file is None:
        return [0]
    src = _check_strategy("src_strategy_file", src_strategy_file)
    dst = _check_strategy("dst_strategy_file", dst_strategy_file)
    return _native.rank_list_for_transform(rank_id, src, dst)


def transform_checkpoint_by_rank(
    rank_id, checkpoint_files_map, save_checkpoint_file_name, src_strategy_file=None, dst_strategy_file=None
):
    """Write the checkpoint of destination rank ``rank_id`` from the source files
    ``{rank: path}`` (those ``rank_list_for_transform`` names are enough)."""
    if not isinstance(checkpoint_files_map, dict):
        raise TypeError("The checkpoint_files_map should be a dict.")
    _check_rank(rank_id)
    if isinstance(save_checkpoint_file_name, os.PathLike):
        save_checkpoint_file_name = os.fspath(save_checkpoint_file_name)
    if not isinstance(save_checkpoint_file_name, str):
        raise TypeError("The save_checkpoint_file_name should be a str.")
    if os.path.isdir(save_checkpoint_file_name):
        raise IsADirectoryError(f"The save_checkpoint_file_name {save_checkpoint_file_name} is a directory: give a file name.")
    if save_checkpoint_file_name[-5:] != ".ckpt":
        raise ValueError(f"The save_checkpoint_file_name {save_checkpoint_file_name} should end with .ckpt")
    dst = _check_strategy("dst_strategy_file", dst_strategy_file)
    src = _check_strategy("src_strategy_file", src_strategy_file)
    files = {}
    for rank, local_file in checkpoint_files_map.items():
        if not isinstance(rank, int) or isinstance(rank, bool) or rank < 0 or rank >= 2**32:
            raise ValueError(f"The checkpoint_files_map keys are source ranks (ints of 0 or more), but got {rank!r}.")
        if not os.path.exists(local_file):
            raise ValueError(f"Checkpoint file {local_file} in rank {rank} not exits: ")
        files[int(rank)] = os.fspath(local_file)
    # The output's folder is made when the file is written, after every check: a failed call
    # leaves nothing behind.
    _native.transform_checkpoint_by_rank(rank_id, files, save_checkpoint_file_name, src, dst, progress=_progress())


def transform_checkpoints(
    src_checkpoints_dir,
    dst_checkpoints_dir,
    ckpt_prefix,
    src_strategy_file=None,
    dst_strategy_file=None,
    process_num=1,
    output_format="ckpt",
):
    """Transform every rank's checkpoint of ``src_checkpoints_dir/rank_<k>/`` to the destination
    strategy, into ``dst_checkpoints_dir/rank_<r>/<ckpt_prefix><r>.<output_format>``.
    ``process_num`` destination files are written at the same time."""
    src_checkpoints_dir, dst_checkpoints_dir = (os.fspath(p) if isinstance(p, os.PathLike) else p for p in (src_checkpoints_dir, dst_checkpoints_dir))
    if not isinstance(src_checkpoints_dir, str) or not isinstance(dst_checkpoints_dir, str):
        raise TypeError("The src_checkpoints_dir and dst_checkpoints_dir should be str.")
    if output_format not in ("ckpt", "safetensors"):
        raise ValueError(f"For 'transform_checkpoints', 'output_format' must be 'ckpt' or 'safetensors', but got {output_format}.")
    has_st = bool(glob.glob(os.path.join(src_checkpoints_dir, "rank_[0-9]*", "*.safetensors")))
    has_ckpt = bool(glob.glob(os.path.join(src_checkpoints_dir, "rank_[0-9]*", "*.ckpt")))
    if has_st and has_ckpt:
        raise ValueError(
            "For 'transform_checkpoints', the 'src_checkpoints_dir' cannot contain both ckpt file and safetensors file simultaneously"
        )
    if not has_st and not has_ckpt:
        if os.path.exists(src_checkpoints_dir) and not os.path.isdir(src_checkpoints_dir):
            raise NotADirectoryError(f"src_checkpoints_dir {src_checkpoints_dir} is not a directory.")
        raise ValueError("For 'transform_checkpoints', the 'src_checkpoints_dir' can not be empty.")
    if has_ckpt and output_format == "safetensors":
        raise ValueError(
            "For 'transform_checkpoints', 'output_format' can not be 'safetensors' when 'src_checkpoints_dir' only contains ckpt file."
        )
    if not isinstance(ckpt_prefix, str):
        raise TypeError("The ckpt_prefix should be a str.")
    if not isinstance(process_num, int) or isinstance(process_num, bool) or process_num < 1:
        raise ValueError(f"For 'transform_checkpoints', 'process_num' must be a positive int, but got {process_num}.")
    src = _check_strategy("src_strategy_file", src_strategy_file)
    dst = _check_strategy("dst_strategy_file", dst_strategy_file)
    if os.path.exists(dst_checkpoints_dir) and not os.path.isdir(dst_checkpoints_dir):
        raise NotADirectoryError(f"dst_checkpoints_dir {dst_checkpoints_dir} is not a directory.")
    _native.transform_checkpoints(
        src_checkpoints_dir, dst_checkpoints_dir, ckpt_prefix, src, dst, process_num, output_format, progress=_progress()
    )


def merge_pipeline_strategys(src_strategy_dirs, dst_strategy_file):
    """Merge the strategy files of every pipeline stage (``*.ckpt`` or ``*.json`` in
    ``src_strategy_dirs``) into ``dst_strategy_file``."""
    if isinstance(src_strategy_dirs, os.PathLike):
        src_strategy_dirs = os.fspath(src_strategy_dirs)
    if isinstance(dst_strategy_file, os.PathLike):
        dst_strategy_file = os.fspath(dst_strategy_file)
    if not isinstance(src_strategy_dirs, str) or not os.path.isdir(src_strategy_dirs):
        raise NotADirectoryError(f"src_strategy_dirs {src_strategy_dirs} is not a directory.")
    if not isinstance(dst_strategy_file, str):
        raise TypeError(f"dst_strategy_file must be a file name, but got {type(dst_strategy_file)}.")
    if os.path.isdir(dst_strategy_file):
        raise IsADirectoryError(f"dst_strategy_file {dst_strategy_file} is a directory: give a file name.")
    _native.merge_pipeline_strategys(src_strategy_dirs, dst_strategy_file)


def _to_numpy(dtype, shape, data):
    if dtype == "str":  # MindSpore stores a numpy "U" array: UTF-32 code points
        return bytes(data).decode("utf-32-le").rstrip("\0")
    if dtype == "BFloat16":
        bits = np.frombuffer(data, dtype="<u2").astype(np.uint32) << 16
        return bits.view(np.float32).reshape(shape)
    return np.frombuffer(data, dtype=np.dtype(_TO_NUMPY[dtype]).newbyteorder("<")).reshape(shape)


def _selector(filter_prefix, specify_prefix, choice_func):
    def prefixes(arg, value):
        if value is None:
            return ()
        if isinstance(value, str):
            return (value,)
        if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
            return tuple(value)
        raise TypeError(f"The type of '{arg}' must be str, list[str] or tuple[str], but got {type(value)}.")

    drop, keep = prefixes("filter_prefix", filter_prefix), prefixes("specify_prefix", specify_prefix)
    if choice_func is not None and not callable(choice_func):
        raise TypeError(f"The type of 'choice_func' must be a function, but got {type(choice_func)}.")
    if drop or keep or choice_func is None:
        return lambda name: (not keep or name.startswith(keep)) and not (drop and name.startswith(drop))
    return lambda name: bool(choice_func(name))


def _refuse(net, dec_key, what):
    if net is not None:
        raise ValueError(
            f"For '{what}', autopar returns the tensors as a dict of numpy arrays and cannot load them into a network: "
            "pass net=None and load the dict with mindspore.load_param_into_net."
        )
    if dec_key is not None:
        raise ValueError(f"For '{what}', encrypted checkpoints are not supported by autopar (dec_key must be None).")


def _load(path, keep, crc_check):
    reader = _native.CheckpointReader(path, crc_check)
    return {name: _to_numpy(dtype, shape, reader.read(name)) for name, dtype, shape in reader.index() if keep(name)}


def load_checkpoint(
    ckpt_file_name,
    net=None,
    strict_load=False,
    filter_prefix=None,
    dec_key=None,
    dec_mode="AES-GCM",
    specify_prefix=None,
    choice_func=None,
    crc_check=False,
    remove_redundancy=False,
    format="ckpt",
):
    """Read a ``.ckpt`` or ``.safetensors`` file into ``{name: numpy array}`` (string entries
    as ``str``). ``crc_check`` verifies the file's CRC trailer when it has one."""
    if not isinstance(ckpt_file_name, (str, os.PathLike)):
        raise TypeError(f"For 'load_checkpoint', the argument 'ckpt_file_name' must be string, but got {type(ckpt_file_name)}.")
    if format not in ("ckpt", "safetensors"):
        raise ValueError(f"For 'load_checkpoint', 'format' must be 'ckpt' or 'safetensors', but got {format}.")
    _refuse(net, dec_key, "load_checkpoint")
    path = os.fspath(ckpt_file_name)
    if not path.endswith("." + format):
        raise ValueError(f"For 'load_checkpoint', the checkpoint file should end with '.{format}', please input the correct 'ckpt_file_name'.")
    if os.path.isdir(path):
        raise IsADirectoryError(f"For 'load_checkpoint', {path} is a directory, not a checkpoint file.")
    if not os.path.isfile(path):
        raise ValueError(f"For 'load_checkpoint', the checkpoint file: {path} does not exist, please check whether the 'ckpt_file_name' is correct.")
    out = _load(path, _selector(filter_prefix, specify_prefix, choice_func), crc_check)
    if not out:
        if os.path.getsize(path) == 0 or not _load(path, lambda _: True, False):
            raise ValueError(f"For 'load_checkpoint', the checkpoint file {path} holds no tensors.")
        raise ValueError(f"The loaded parameter dict is empty after filter or specify, please check whether 'filter_prefix' or 'specify_prefix' are set correctly for {path}.")
    return out


def load_segmented_checkpoints(
    ckpt_file_dir,
    net=None,
    strict_load=False,
    filter_prefix=None,
    dec_key=None,
    dec_mode="AES-GCM",
    specify_prefix=None,
    choice_func=None,
):
    """Every ``*.ckpt`` file of ``ckpt_file_dir`` merged into one ``{name: numpy array}``
    (later files, in name order, override earlier ones)."""
    if isinstance(ckpt_file_dir, os.PathLike):
        ckpt_file_dir = os.fspath(ckpt_file_dir)
    if not isinstance(ckpt_file_dir, str):
        raise TypeError("The ckpt_file_dir should be a str.")
    if not os.path.isdir(ckpt_file_dir):
        raise ValueError(f"The dst_strategy_file: {ckpt_file_dir} doesn't exist. Or it's not a directory")
    _refuse(net, dec_key, "load_segmented_checkpoints")
    keep = _selector(filter_prefix, specify_prefix, choice_func)
    out = {}
    for path in sorted(glob.glob(os.path.join(ckpt_file_dir, "*.ckpt"))):
        out.update(_load(path, keep, False))
    if not out:
        raise ValueError(f"For 'load_segmented_checkpoints', no parameter was loaded from {ckpt_file_dir}.")
    return out


def _entries(save_obj, append_dict):
    if isinstance(save_obj, dict):
        items = list(save_obj.items())
    elif isinstance(save_obj, list):
        items = []
        for entry in save_obj:
            if isinstance(entry, dict) and "name" in entry and "data" in entry:
                items.append((entry["name"], entry["data"]))
            elif isinstance(entry, (list, tuple)) and len(entry) == 2:
                items.append((entry[0], entry[1]))
            else:
                raise TypeError(
                    "For 'save_checkpoint', the element of 'save_obj' must be a dict {'name': ..., 'data': ...} "
                    f"or a (name, data) pair, but got {entry!r}."
                )
    else:
        raise TypeError(f"For 'save_checkpoint', the argument 'save_obj' must be dict or list, but got {type(save_obj)}.")
    if append_dict is not None and not isinstance(append_dict, dict):
        raise TypeError(f"For 'save_checkpoint', the argument 'append_dict' must be a dict, but got {type(append_dict)}.")
    for name, value in (append_dict or {}).items():
        if isinstance(value, (bool, int, float, str, np.ndarray, np.generic)):
            items.append((name, value))
        else:
            raise TypeError(f"For 'save_checkpoint', the value of 'append_dict' must be str, int, float, bool or an array, but got {type(value)}.")
    return items


def _to_entry(name, value):
    if not isinstance(name, str):
        raise TypeError(f"For 'save_checkpoint', the parameter name must be a str, but got {type(name)}.")
    if isinstance(value, str):
        return (name, "str", [], value.encode("utf-32-le"))
    if isinstance(value, bool):
        array = np.array(value, dtype=np.bool_)
    elif isinstance(value, int):
        array = np.array(value, dtype=np.int64)
    elif isinstance(value, float):
        array = np.array(value, dtype=np.float32)
    else:
        array = np.asarray(value)
    dtype = _FROM_NUMPY.get(array.dtype.newbyteorder("="))
    if dtype is None:
        raise TypeError(f"For 'save_checkpoint', tensor {name!r} has dtype {array.dtype}, which a checkpoint cannot hold.")
    data = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<")).tobytes()
    return (name, dtype, list(array.shape), data)


def save_checkpoint(
    save_obj,
    ckpt_file_name,
    integrated_save=True,
    async_save=False,
    append_dict=None,
    enc_key=None,
    enc_mode="AES-GCM",
    choice_func=None,
    crc_check=False,
    format="ckpt",
    **kwargs,
):
    """Write ``{name: array}`` (or MindSpore's ``[{"name": ..., "data": ...}]``) plus
    ``append_dict`` to ``ckpt_file_name`` atomically; ``crc_check`` appends MindSpore's CRC."""
    if not isinstance(ckpt_file_name, (str, os.PathLike)):
        raise TypeError(f"For 'save_checkpoint', the argument 'ckpt_file_name' must be string, but got {type(ckpt_file_name)}.")
    if format not in ("ckpt", "safetensors"):
        raise ValueError(f"For 'save_checkpoint', 'format' must be 'ckpt' or 'safetensors', but got {format}.")
    if enc_key is not None:
        raise ValueError("For 'save_checkpoint', encrypted checkpoints are not supported by autopar (enc_key must be None).")
    if kwargs:
        raise TypeError(f"For 'save_checkpoint', unexpected keyword arguments: {sorted(kwargs)}.")
    path = os.fspath(ckpt_file_name)
    if os.path.isdir(path) or path.endswith(("/", os.sep)):
        raise IsADirectoryError(f"For 'save_checkpoint', 'ckpt_file_name' {path} is a directory: give a file name.")
    if not path.endswith("." + format):
        path += "." + format
    if os.path.isdir(path):
        raise IsADirectoryError(f"For 'save_checkpoint', {path} is a directory: give another file name.")
    entries = [_to_entry(n, v) for n, v in _entries(save_obj, append_dict) if choice_func is None or choice_func(n)]
    seen = set()
    for name, *_ in entries:
        if name in seen:
            raise ValueError(f"For 'save_checkpoint', the name {name!r} is given twice (in 'save_obj' or 'append_dict'): a checkpoint holds each name once.")
        seen.add(name)
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    _native.write_checkpoint(path, entries, {}, crc_check)


def load_distributed_checkpoint(
    network=None,
    checkpoint_filenames=None,
    predict_strategy=None,
    train_strategy_filename=None,
    strict_load=False,
    dec_key=None,
    dec_mode="AES-GCM",
    format="ckpt",
    rank_id=None,
):
    """The tensors of rank ``rank_id`` (default 0) under ``predict_strategy`` (a strategy file;
    ``None``: whole, unsplit tensors), resharded from the training checkpoints
    ``checkpoint_filenames`` (one per training rank, in rank order) saved under
    ``train_strategy_filename``, as ``{name: numpy array}``."""
    _refuse(network, dec_key, "load_distributed_checkpoint")
    if format not in ("ckpt", "safetensors"):
        raise ValueError(f"For 'load_distributed_checkpoint', 'format' must be 'ckpt' or 'safetensors', but got {format}.")
    if not isinstance(checkpoint_filenames, (list, tuple)) or not checkpoint_filenames:
        raise TypeError("For 'load_distributed_checkpoint', 'checkpoint_filenames' must be a non-empty list of file names in rank order.")
    for name in checkpoint_filenames:
        if not isinstance(name, (str, os.PathLike)) or not os.path.isfile(name):
            raise ValueError(f"For 'load_distributed_checkpoint', the checkpoint file {name} does not exist.")
    if predict_strategy is not None and not isinstance(predict_strategy, (str, os.PathLike)):
        raise TypeError(
            "For 'load_distributed_checkpoint', 'predict_strategy' must be a strategy file name or None "
            f"(autopar has no network to infer a layout dict from), but got {type(predict_strategy)}."
        )
    rank = 0 if rank_id is None else rank_id
    _check_rank(rank)
    if train_strategy_filename is None and len(checkpoint_filenames) > 1:
        # Without it every file would be taken for a whole copy: rank 0's slices returned as
        # the whole tensors.
        raise ValueError(
            f"For 'load_distributed_checkpoint', the {len(checkpoint_filenames)} checkpoint files need "
            "'train_strategy_filename', the strategy file they were saved under."
        )
    train = _check_strategy("train_strategy_filename", train_strategy_filename)
    predict = _check_strategy("predict_strategy", predict_strategy)
    files = {r: os.fspath(f) for r, f in enumerate(checkpoint_filenames)}
    with tempfile.TemporaryDirectory(prefix="autopar-load-") as tmp:
        out = os.path.join(tmp, f"rank_{rank}.{format}")
        _native.transform_checkpoint_by_rank(rank, files, out, train, predict, progress=_progress())
        return _load(out, lambda _: True, False)
