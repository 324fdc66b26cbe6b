"""plan() and train() drive the engine with the command line's options as keyword arguments."""

import json

import numpy as np
import pytest

import autopar


def load_arrays(*args, **kwargs):
    """autopar.load_checkpoint's Parameters as numpy arrays (string entries as they are)."""
    return {k: (v.asnumpy() if hasattr(v, "asnumpy") else v) for k, v in autopar.load_checkpoint(*args, **kwargs).items()}


def test_keyword_arguments_become_the_command_lines_flags():
    words = autopar.cli.command_line(
        "train", model="mlp", batch_size=64, verify=True, verbose=2, eval=False, seed=None, parallel={"pipeline_stages": 2, "comm_fusion": {"allreduce": {"mode": "size"}}}
    )
    assert words == [
        "train", "--model=mlp", "--batch-size=64", "--verify", "-vv",
        "--parallel=pipeline_stages=2", '--parallel=comm_fusion={"allreduce": {"mode": "size"}}',
    ]


def test_plan_returns_the_report_as_a_dict():
    report = autopar.cli.plan(model="mlp", devices=8, parallel_mode="semi_auto_parallel")
    text = json.dumps(report)
    assert "fc1.weight" in text
    pipeline = autopar.cli.plan(model="gpt", devices=8, parallel={"pipeline_stages": 2}, micro_batches=4)
    assert set(pipeline) == {"pipeline", "plan", "summary"}
    assert pipeline["summary"]["step_seconds"]["total"] > 0 and isinstance(pipeline["summary"]["warnings"], list)
    layouts = autopar.cli.plan(model="mlp", devices=8, mindspore_layouts=True)
    assert isinstance(layouts, str) and "fc1.weight: ([8]" in layouts


def test_plan_and_train_write_the_web_page(tmp_path):
    autopar.cli.plan(model="mlp", devices=4, html=str(tmp_path / "plan.html"))
    page = (tmp_path / "plan.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and 'id="operators-table"' in page
    autopar.cli.train(model="mlp", data="synthetic", synthetic_samples=256, steps=2, devices=2, eval=False, report=str(tmp_path / "run.html"))
    assert 'id="measured"' in (tmp_path / "run.html").read_text()


def test_train_on_simulated_devices_equals_stand_alone(tmp_path):
    summary = autopar.cli.train(
        model="mlp", data="synthetic", synthetic_samples=512, steps=4, devices=4, parallel_mode="data_parallel",
        verify=True, checkpoint_dir=str(tmp_path / "ckpt"),
    )
    assert summary["devices"] == 4 and summary["last_step"] == 4 and len(summary["losses"]) == 4
    assert summary["verify"]["ok"] and summary["verify"]["loss_relative"] < 1e-5
    # the checkpoint it wrote reads back through the package
    params = load_arrays(summary["checkpoint"], format="safetensors")
    assert params["fc1.weight"].dtype == np.float32


def test_bad_options_and_failed_runs_raise():
    with pytest.raises(ValueError, match="--no-such-flag"):
        autopar.cli.train(model="mlp", no_such_flag=3)
    with pytest.raises(RuntimeError, match="hint"):
        autopar.cli.train(model="mlp", data="synthetic", steps=1, devices=3, parallel_mode="semi_auto_parallel", strategy="/nonexistent.json")
    with pytest.raises(TypeError, match="json"):
        autopar.cli.plan(model="mlp", json=True)
