"""Checkpoints to and from numpy: every dtype both ways, MindSpore's files, resharding into a dict."""

import os
from pathlib import Path

import numpy as np
import pytest

import autopar


def load_arrays(*args, **kwargs):
    """autopar.load_checkpoint's Parameters as numpy arrays (string entries as they are)."""
    return {k: (v.asnumpy() if hasattr(v, "asnumpy") else v) for k, v in autopar.load_checkpoint(*args, **kwargs).items()}

ROOT = Path(__file__).resolve().parents[3]
FIX = ROOT / "fixtures" / "mindspore"
CASE = FIX / "transforms" / "ckpt_out_semi_train_optshard_to_out_dp4"
SRC_STRATEGY = str(FIX / "strategies" / "semi_train_optshard" / "strategy_rank0.ckpt")
DST_STRATEGY = str(FIX / "strategies" / "dp4" / "strategy_rank0.ckpt")

DTYPES = [np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64, np.float16, np.float32, np.float64]


def sample(dtype, shape, seed):
    rng = np.random.default_rng(seed)
    if dtype == np.bool_:
        return rng.integers(0, 2, shape).astype(np.bool_)
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, shape, dtype=dtype, endpoint=True)
    return rng.standard_normal(shape).astype(dtype)


@pytest.mark.parametrize("fmt", ["ckpt", "safetensors"])
def test_every_dtype_round_trips_bit_for_bit(tmp_path, fmt):
    tensors = {f"t.{np.dtype(d).name}": sample(d, (3, 5), i) for i, d in enumerate(DTYPES)}
    tensors["scalar"] = np.array(2.5, dtype=np.float32)
    tensors["big_endian"] = np.arange(6, dtype=">i4").reshape(2, 3)
    path = tmp_path / f"all.{fmt}"
    autopar.save_checkpoint(tensors, str(path), format=fmt, crc_check=fmt == "ckpt")
    back = load_arrays(str(path), format=fmt, crc_check=True)
    assert sorted(back) == sorted(tensors)
    for name, want in tensors.items():
        got = back[name]
        assert got.shape == want.shape and got.dtype == want.dtype.newbyteorder("="), name
        assert got.tobytes() == np.ascontiguousarray(want, dtype=want.dtype.newbyteorder("=")).tobytes(), name
        got[...] = got  # the arrays are writable, as MindSpore's asnumpy() ones are


def test_mindspores_list_form_and_append_dict_are_saved(tmp_path):
    path = str(tmp_path / "net.ckpt")
    autopar.save_checkpoint(
        [{"name": "w", "data": np.ones((2, 2), np.float32)}, ("b", np.zeros(2, np.float16))],
        path,
        append_dict={"epoch_num": 3, "lr": 0.5, "tag": "run-1", "done": True},
    )
    back = load_arrays(path)
    assert back["epoch_num"].dtype == np.int64 and back["epoch_num"] == 3
    assert back["lr"].dtype == np.float32 and back["lr"] == 0.5
    assert back["tag"] == "run-1" and back["done"].dtype == np.bool_
    assert list(load_arrays(path, specify_prefix="w")) == ["w"]
    assert "w" not in load_arrays(path, filter_prefix=["w", "x"])
    assert list(load_arrays(path, choice_func=lambda n: n == "b")) == ["b"]


def test_bfloat16_is_read_as_exact_float32(tmp_path):
    values = np.array([1.0, -2.5, 3.140625, 2.0**100], dtype=np.float32)
    bits = (values.view(np.uint32) >> 16).astype(np.uint16)
    path = str(tmp_path / "bf16.ckpt")
    autopar.save_checkpoint({"x": bits}, path)
    # rewrite the dtype: a BFloat16 entry written through the native writer
    autopar._native.write_checkpoint(path, [("x", "BFloat16", [4], bits.tobytes())])
    got = load_arrays(path)["x"]
    assert got.dtype == np.float32 and np.array_equal(got, values)


def test_mindspore_written_files_load():
    t = load_arrays(str(CASE / "src" / "rank_0" / "net_0.ckpt"))
    assert t["l1.w"].dtype == np.float32 and t["l1.w"].ndim == 2
    reader = autopar.CheckpointReader(str(CASE / "src" / "rank_0" / "net_0.ckpt"))
    assert ("l1.w", "Float32", list(t["l1.w"].shape)) in reader.index()


def test_distributed_checkpoint_merges_into_full_tensors_from_either_strategy():
    src = [str(CASE / "src" / f"rank_{r}" / f"net_{r}.ckpt") for r in range(8)]
    dst = [str(CASE / "dst" / f"rank_{r}" / f"net_{r}.ckpt") for r in range(4)]
    full_from_src = autopar.load_distributed_checkpoint(None, src, None, SRC_STRATEGY)
    full_from_dst = autopar.load_distributed_checkpoint(None, dst, None, DST_STRATEGY)
    assert full_from_src.keys() == full_from_dst.keys()
    for name in full_from_src:
        assert np.array_equal(full_from_src[name], full_from_dst[name]), name
    # rank 3 of dp4 (data parallel) holds every parameter whole: equal to the merged tensors
    rank3 = autopar.load_distributed_checkpoint(None, src, DST_STRATEGY, SRC_STRATEGY, rank_id=3)
    for name, value in load_arrays(dst[3]).items():
        assert np.array_equal(rank3[name], value), name
    # a slice of semi_train_optshard, resharded back, equals the source file's slice
    rank5 = autopar.load_distributed_checkpoint(None, dst, SRC_STRATEGY, DST_STRATEGY, rank_id=5)
    assert np.array_equal(rank5["l1.w"], load_arrays(src[5])["l1.w"])
    with pytest.raises(ValueError, match="net=None"):
        autopar.load_distributed_checkpoint(object(), src, None, SRC_STRATEGY)
    with pytest.raises(TypeError, match="predict_strategy"):
        autopar.load_distributed_checkpoint(None, src, {"l1.w": []}, SRC_STRATEGY)


def test_segmented_checkpoints_merge_a_folder(tmp_path):
    autopar.save_checkpoint({"a": np.ones(2, np.float32), "b": np.zeros(1, np.int32)}, str(tmp_path / "0.ckpt"))
    autopar.save_checkpoint({"b": np.ones(1, np.int32)}, str(tmp_path / "1.ckpt"))
    autopar.save_checkpoint({"c": np.ones(1, np.int32)}, str(tmp_path / "2.safetensors"), format="safetensors")
    d = autopar.load_segmented_checkpoints(str(tmp_path))
    assert sorted(d) == ["a", "b"] and d["b"][0] == 1  # *.ckpt only, later files win
    assert sorted(autopar.load_segmented_checkpoints(str(tmp_path), filter_prefix="a")) == ["b"]
    with pytest.raises(ValueError, match="net=None"):
        autopar.load_segmented_checkpoints(str(tmp_path), net=object())


def test_corrupted_files_raise_value_errors_naming_the_file(tmp_path):
    path = tmp_path / "c.ckpt"
    autopar.save_checkpoint({"w": np.arange(1000, dtype=np.float32)}, str(path), crc_check=True)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="c.ckpt"):
        load_arrays(str(path), crc_check=True)
    path.write_bytes(bytes(data[: len(data) // 3]))
    with pytest.raises(ValueError, match="c.ckpt"):
        load_arrays(str(path))
    with pytest.raises(TypeError, match="dtype"):
        autopar.save_checkpoint({"o": np.array(["x"], dtype=object)}, str(tmp_path / "o.ckpt"))


@pytest.mark.parametrize("name", ["append_dict", "crc"])
def test_saving_what_mindspore_saved_gives_its_bytes(tmp_path, name):
    theirs = FIX / "saved" / f"{name}.ckpt"
    loaded = load_arrays(str(theirs), crc_check=True)
    tensors = {k: loaded[k] for k in ("fc.weight", "fc.bias", "steps")}
    assert tensors["fc.bias"].dtype == np.float16 and tensors["steps"].dtype == np.int32
    extra = {"append_dict": {"tag": "run-1é", "epoch_num": 3, "lr": 0.5, "done": True}, "crc": None}[name]
    if extra:
        assert loaded["tag"] == "run-1é" and loaded["epoch_num"] == 3
    ours = tmp_path / f"{name}.ckpt"
    autopar.save_checkpoint(
        [{"name": k, "data": v} for k, v in tensors.items()], str(ours), append_dict=extra, crc_check=name == "crc"
    )
    assert ours.read_bytes() == theirs.read_bytes()
