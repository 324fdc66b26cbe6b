"""MindSpore's own example scripts (the docstrings of mindspore.parallel.checkpoint_transform),
run unchanged but for the import, against the autopar package and MindSpore 2.10's committed
outputs in fixtures/mindspore."""

import filecmp
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

import autopar as ms  # the one changed line: was `import mindspore as ms`

ROOT = Path(__file__).resolve().parents[3]
FIX = ROOT / "fixtures" / "mindspore"
STRATEGIES = FIX / "strategies"
TRANSFORMS = FIX / "transforms"

# (fixture folder, source strategy, destination strategy, format)
CASES = [
    ("ckpt_out_semi_train_optshard_to_out_dp4", "semi_train_optshard", "dp4", "ckpt"),
    ("safetensors_out_semi_train_optshard_to_out_semi_train", "semi_train_optshard", "semi_train", "safetensors"),
]


def strategy(name):
    return str(STRATEGIES / name / "strategy_rank0.ckpt")


def rank_dirs(folder):
    return sorted(int(p.name.split("_")[1]) for p in folder.glob("rank_*"))


def assert_same_files(got_dir, want_dir):
    for rank in rank_dirs(want_dir):
        for want in (want_dir / f"rank_{rank}").iterdir():
            got = got_dir / f"rank_{rank}" / want.name
            assert got.is_file(), f"{got} was not written"
            assert filecmp.cmp(got, want, shallow=False), f"{got} differs from MindSpore's {want}"


@pytest.mark.parametrize("case,src,dst,fmt", CASES)
def test_transform_checkpoints_script(tmp_path, case, src, dst, fmt):
    # >>> ms.transform_checkpoints(src_checkpoints_dir, dst_checkpoints_dir, "dst_checkpoint",
    # ...                       "./src_strategy.ckpt", "./dst_strategy.ckpt")
    src_checkpoints_dir = str(TRANSFORMS / case / "src")
    dst_checkpoints_dir = str(tmp_path / "dst")
    ms.transform_checkpoints(
        src_checkpoints_dir, dst_checkpoints_dir, "net_", strategy(src), strategy(dst), output_format=fmt
    )
    assert_same_files(tmp_path / "dst", TRANSFORMS / case / "dst")


def test_transform_checkpoint_by_rank_script(tmp_path):
    # The docstring's loop: for every destination rank, the rank list, then the transform.
    case, src, dst, _ = CASES[0]
    os.chdir(tmp_path)
    shutil.copy(strategy(src), "src_strategy.ckpt")
    shutil.copy(strategy(dst), "dst_strategy.ckpt")
    for rank in rank_dirs(TRANSFORMS / case / "src"):
        shutil.copytree(TRANSFORMS / case / "src" / f"rank_{rank}", f"origin_checkpoint_rank{rank}")
    dst_device_num = len(rank_dirs(TRANSFORMS / case / "dst"))
    for rank_id in range(dst_device_num):
        rank_list = ms.rank_list_for_transform(rank_id, "./src_strategy.ckpt", "./dst_strategy.ckpt")
        checkpoint_files_map = {}
        for rank in rank_list:
            checkpoint_files_map[rank] = "./origin_checkpoint_rank{}/net_{}.ckpt".format(rank, rank)
        save_checkpoint_file_name = "./new_checkpoint_rank{}/net_{}.ckpt".format(rank_id, rank_id)
        ms.transform_checkpoint_by_rank(
            rank_id, checkpoint_files_map, save_checkpoint_file_name, "./src_strategy.ckpt", "./dst_strategy.ckpt"
        )
        want = TRANSFORMS / case / "dst" / f"rank_{rank_id}" / f"net_{rank_id}.ckpt"
        assert filecmp.cmp(save_checkpoint_file_name, want, shallow=False), f"rank {rank_id} differs from MindSpore's"


def test_merge_pipeline_strategys_script(tmp_path):
    # >>> # src_strategy_dir/stra0.ckpt, src_strategy_dir/stra1.ckpt ... src_strategy_dir/stra127.ckpt
    # >>> ms.merge_pipeline_strategys("./src_strategy_dir", "./dst_strategy.ckpt")
    os.chdir(tmp_path)
    shutil.copytree(STRATEGIES / "pp2" / "src", "src_strategy_dir")
    ms.merge_pipeline_strategys("./src_strategy_dir", "./dst_strategy.ckpt")
    # MindSpore lists the stages' entries in its directory-listing order: the same entries,
    # possibly in another order. Equal sizes, and every rank list read through either file agrees.
    theirs = STRATEGIES / "pp2" / "merged_strategy.ckpt"
    assert os.path.getsize("dst_strategy.ckpt") == os.path.getsize(theirs)
    for other in ["dp", "semi_all", "pp2/merged_strategy.ckpt"]:
        other = str(STRATEGIES / other) if other.endswith(".ckpt") else strategy(other)
        for rank in range(8):
            assert ms.rank_list_for_transform(rank, "dst_strategy.ckpt", other) == ms.rank_list_for_transform(rank, str(theirs), other)
            assert ms.rank_list_for_transform(rank, other, "dst_strategy.ckpt") == ms.rank_list_for_transform(rank, other, str(theirs))


def test_rank_lists_equal_mindspores_on_every_committed_pair():
    pairs = json.loads((FIX / "rank_lists" / "strategy_pairs.json").read_text())
    checked = 0
    for pair in pairs:
        src = str(ROOT / pair["src"]) if pair["src"] else None
        dst = str(ROOT / pair["dst"]) if pair["dst"] else None
        for rank, want in enumerate(pair["lists"]):
            if isinstance(want, dict):  # MindSpore raised: the error is recorded instead of a list
                continue
            assert ms.rank_list_for_transform(rank, src, dst) == want, (pair["src"], pair["dst"], rank)
            checked += 1
    assert checked > 500


def test_mindspore_errors_keep_their_types(tmp_path):
    case, src, dst, _ = CASES[0]
    with pytest.raises(TypeError, match="rank_id should be a int"):
        ms.rank_list_for_transform("0", strategy(src), strategy(dst))
    with pytest.raises(TypeError, match="checkpoint_files_map should be a dict"):
        ms.transform_checkpoint_by_rank(0, [], "out.ckpt", strategy(src), strategy(dst))
    with pytest.raises(ValueError, match="should end with .ckpt"):
        ms.transform_checkpoint_by_rank(0, {}, "out.safetensors", strategy(src), strategy(dst))
    with pytest.raises(ValueError, match="not exits"):
        ms.transform_checkpoint_by_rank(0, {0: str(tmp_path / "missing.ckpt")}, str(tmp_path / "o.ckpt"), strategy(src))
    with pytest.raises(NotADirectoryError):
        ms.merge_pipeline_strategys(str(tmp_path / "nowhere"), str(tmp_path / "m.ckpt"))
    with pytest.raises(ValueError, match="can not be empty"):
        ms.transform_checkpoints(str(tmp_path), str(tmp_path / "out"), "net_", strategy(src), strategy(dst))
    with pytest.raises(ValueError, match="can not be 'safetensors'"):
        ms.transform_checkpoints(str(TRANSFORMS / case / "src"), str(tmp_path / "o"), "n", strategy(src), strategy(dst), output_format="safetensors")
    with pytest.raises(TypeError, match="ckpt_file_dir should be a str"):
        ms.load_segmented_checkpoints(3)
    # A missing source rank is a ValueError naming the rank and the file.
    files = {0: str(TRANSFORMS / case / "src" / "rank_0" / "net_0.ckpt")}
    with pytest.raises(ValueError, match="source rank"):
        ms.transform_checkpoint_by_rank(0, files, str(tmp_path / "o.ckpt"), strategy(src), strategy(dst))
    # A strategy file that is not one.
    bad = tmp_path / "bad.ckpt"
    bad.write_bytes(b"\xff\xff\xff not a strategy")
    with pytest.raises(ValueError, match="bad.ckpt"):
        ms.rank_list_for_transform(0, str(bad), strategy(dst))
