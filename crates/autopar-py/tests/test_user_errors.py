"""What a user gets wrong is an exception naming it, raised before any work, and Ctrl-C stops a run."""

import os
import signal
import threading
import time
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
OTHER_NETWORK = str(FIX / "strategies" / "pp_shared" / "strategy_rank0.ckpt")


def test_keywords_become_one_word_per_flag():
    words = autopar.cli.command_line("train", verbose=0, input_shape=[28, 28], devices=-1, parallel={"b": None})
    assert words == ["train", "--input-shape=28,28", "--devices=-1", "--parallel=b=null"]
    with pytest.raises(ValueError, match="verbose"):
        autopar.cli.command_line("train", verbose=-1)


def test_a_strategy_of_another_network_is_refused_and_leaves_nothing(tmp_path):
    files = {r: str(CASE / "src" / f"rank_{r}" / f"net_{r}.ckpt") for r in range(8)}
    assert autopar.rank_list_for_transform(0, OTHER_NETWORK, DST_STRATEGY) == []  # as MindSpore's
    with pytest.raises(ValueError, match="no parameter in common"):
        autopar.transform_checkpoint_by_rank(0, files, tmp_path / "out" / "never.ckpt", OTHER_NETWORK, DST_STRATEGY)
    with pytest.raises(ValueError, match="no parameter in common"):
        autopar.transform_checkpoints(CASE / "src", tmp_path / "all", "net_", OTHER_NETWORK, DST_STRATEGY)
    assert not (tmp_path / "out").exists() and not (tmp_path / "all").exists()


def test_bad_ranks_and_append_dicts_name_the_argument(tmp_path):
    f = str(CASE / "src" / "rank_0" / "net_0.ckpt")
    for key in ["a", -1]:
        with pytest.raises(ValueError, match="checkpoint_files_map keys"):
            autopar.transform_checkpoint_by_rank(0, {key: f}, str(tmp_path / "n.ckpt"), SRC_STRATEGY, DST_STRATEGY)
    with pytest.raises(ValueError, match="rank_id"):
        autopar.rank_list_for_transform(2**64, SRC_STRATEGY, DST_STRATEGY)
    with pytest.raises(TypeError, match="append_dict"):
        autopar.save_checkpoint({"w": np.zeros(2)}, str(tmp_path / "a.ckpt"), append_dict=[1])


def test_distributed_files_need_their_strategy():
    src = [str(CASE / "src" / f"rank_{r}" / f"net_{r}.ckpt") for r in range(8)]
    with pytest.raises(ValueError, match="train_strategy_filename"):
        autopar.load_distributed_checkpoint(None, src, None, None)
    # One file is a whole checkpoint: no strategy needed.
    whole = autopar.load_distributed_checkpoint(None, [str(CASE / "dst" / "rank_0" / "net_0.ckpt")], None, None)
    assert whole["l1.w"].shape == (64, 128)


def test_save_refuses_a_name_twice_and_a_folder(tmp_path):
    with pytest.raises(ValueError, match="'epoch_num' is given twice"):
        autopar.save_checkpoint({"epoch_num": np.zeros(2)}, str(tmp_path / "d.ckpt"), append_dict={"epoch_num": 3})
    assert not (tmp_path / "d.ckpt").exists()
    (tmp_path / "dir.ckpt").mkdir()
    with pytest.raises(IsADirectoryError):
        autopar.save_checkpoint({"w": np.zeros(2)}, str(tmp_path / "dir.ckpt"))
    with pytest.raises(IsADirectoryError):
        autopar.save_checkpoint({"w": np.zeros(2)}, str(tmp_path) + os.sep)
    with pytest.raises(IsADirectoryError):
        load_arrays(str(tmp_path / "dir.ckpt"))
    (tmp_path / "empty.ckpt").write_bytes(b"")
    with pytest.raises(ValueError, match="holds no tensors"):
        load_arrays(str(tmp_path / "empty.ckpt"))


def test_ctrl_c_stops_a_training_run_promptly():
    # Python's own Ctrl-C handler, whatever this process inherited (a job started in the
    # background by a script ignores SIGINT, and Python keeps it ignored).
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    timer = threading.Timer(1.0, lambda: os.kill(os.getpid(), signal.SIGINT))
    start = time.monotonic()
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            autopar.cli.train(model="mlp", data="synthetic", steps=20_000, devices=2, eval=False)
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, previous)
    assert time.monotonic() - start < 10
