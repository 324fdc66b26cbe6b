"""The MindSpore front end: MindSpore scripts run with `mindspore` changed to `autopar`.

Each script of fixtures/mindspore/scripts runs on one device against MindSpore 2.10's own
stand-alone CPU losses (expected.json), then on the devices its DEVICES branch shards it over
(semi_auto strategies, data_parallel, auto_parallel's search) against the one-device run.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import autopar as ms
import autopar.dataset as ds
from autopar import nn, ops

ROOT = Path(__file__).resolve().parents[3]
SCRIPTS = ROOT / "fixtures" / "mindspore" / "scripts"
EXPECTED = json.loads((SCRIPTS / "expected.json").read_text())
# The devices each script's DEVICES branch is written for.
DEVICES = {
    "mlp_momentum.py": 8,
    "dense_adam.py": 8,
    "regression_sgd.py": 4,
    "onehot_adamw.py": 8,
    "conv_momentum.py": 4,
    "eval_predict.py": 4,
    "groups_dynamic_lr.py": 4,
    "attention_embedding.py": 8,
    "batchnorm_avgpool.py": 4,
    "train_one_step_loop.py": 4,
    "mlp_dropout_loop.py": 8,
    "embedding_bag_adam.py": 8,
    "loss_scale_fixed.py": 4,
    "functional_value_and_grad.py": 8,
    "lr_schedule_cells.py": 4,
}
TOL = 1e-5


def run_script(tmp_path, name, devices):
    """The script with its imports changed, run in a fresh interpreter; its printed values."""
    source = (SCRIPTS / name).read_text().replace("mindspore", "autopar")
    path = tmp_path / name
    path.write_text(source)
    env = {**os.environ, "DEVICES": str(devices)}
    run = subprocess.run([sys.executable, str(path)], cwd=tmp_path, capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0, f"{name} on {devices} device(s) failed:\n{run.stderr[-4000:]}"
    printed = {}
    for line in run.stdout.splitlines():
        key, _, rest = line.partition(" ")
        if key.isupper() and rest.startswith("["):
            printed[key] = json.loads(rest.replace("'", '"'))
    return printed


def assert_close(got, want, what):
    assert len(got) == len(want), f"{what}: {len(got)} values, expected {len(want)}"
    for i, (g, w) in enumerate(zip(got, want)):
        if isinstance(w, str):
            assert g == w, f"{what}[{i}]: {g!r} != {w!r}"
        else:
            assert abs(g - w) <= TOL * max(1.0, abs(w)), f"{what}[{i}]: {g} differs from {w} by more than {TOL}"


@pytest.mark.parametrize("name", sorted(DEVICES))
def test_a_mindspore_script_gives_mindspores_losses_on_one_device_and_the_same_sharded(tmp_path, name):
    alone = run_script(tmp_path, name, 1)
    for key, want in EXPECTED[name].items():
        assert_close(alone[key], want, f"{name} {key} beside MindSpore 2.10")
    sharded = run_script(tmp_path, name, DEVICES[name])
    for key, want in alone.items():
        assert_close(sharded[key], want, f"{name} {key} on {DEVICES[name]} devices beside one")


def test_the_parameter_broadcast_example_runs_on_8_simulated_devices(tmp_path):
    env = {**os.environ, "RANK_SIZE": "8", "RANK_ID": "0"}
    run = subprocess.run([sys.executable, str(ROOT / "examples" / "python" / "parameter_broadcast.py")], cwd=tmp_path,
                         capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0, run.stderr[-4000:]
    assert "step end, cur step num:  2" in run.stdout
    assert (tmp_path / "simple.ckpt").is_file()


class Inner(nn.Cell):
    def __init__(self):
        super().__init__()
        self.weight = ms.Parameter(ms.Tensor(np.ones((2, 2), np.float32)), name="w1")
        self.b = ms.Parameter(ms.Tensor(np.ones((2,), np.float32)))
        self.fc = nn.Dense(2, 3)

    def construct(self, x):
        return x


class Outer(nn.Cell):
    def __init__(self):
        super().__init__()
        self.net = Inner()
        self.layers = nn.CellList([nn.Dense(2, 2), nn.Dense(2, 2)])
        self.seq = nn.SequentialCell([nn.Dense(2, 2), nn.ReLU()])

    def construct(self, x):
        return x


def test_parameters_are_named_as_mindspore_names_them():
    # What MindSpore 2.10 printed for the same cells.
    assert [p.name for p in Inner().get_parameters()] == ["w1", "b", "fc.weight", "fc.bias"]
    assert [p.name for p in Outer().get_parameters()] == [
        "net.weight", "net.b", "net.fc.weight", "net.fc.bias", "layers.0.weight", "layers.0.bias",
        "layers.1.weight", "layers.1.bias", "seq.0.weight", "seq.0.bias",
    ]
    assert list(Outer().parameters_dict()) == [p.name for p in Outer().get_parameters()]


def test_a_dataset_shard_reads_every_nth_row_wrapping_around_as_mindspores():
    # MindSpore 2.10: shard 1 of 3 over 10 rows reads [1, 4, 7, 0].
    d = ds.NumpySlicesDataset({"x": np.arange(10).astype(np.float32), "y": np.arange(10)}, shuffle=False, num_shards=3, shard_id=1)
    assert [r[0].asnumpy().tolist() for r in d.create_tuple_iterator()] == [1.0, 4.0, 7.0, 0.0]
    assert d.get_dataset_size() == 4 and d.get_col_names() == ["x", "y"]
    d2 = ds.NumpySlicesDataset((np.arange(10).astype(np.float32), np.arange(10)), shuffle=False).batch(4)
    assert d2.get_col_names() == ["column_0", "column_1"] and d2.get_dataset_size() == 3
    assert [r[0].asnumpy().tolist() for r in d2.create_tuple_iterator()] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


class Tiny(nn.Cell):
    def __init__(self):
        super().__init__()
        self.w = ms.Parameter(ms.Tensor(np.full((4, 2), 0.1, np.float32)), name="w")
        self.matmul = ops.MatMul()

    def construct(self, x):
        return self.matmul(x, self.w)


def tiny_data(rows=16, batch=4):
    rng = np.random.default_rng(0)
    return ds.NumpySlicesDataset({"x": rng.standard_normal((rows, 4)).astype(np.float32), "y": rng.integers(0, 2, rows).astype(np.int32)},
                                 shuffle=False).batch(batch)


@pytest.fixture
def context():
    ms.reset_auto_parallel_context()
    yield
    ms.reset_auto_parallel_context()


def test_training_updates_the_parameters_and_fills_the_layout_dict(context):
    ms.set_auto_parallel_context(parallel_mode="semi_auto_parallel", device_num=4)
    net = Tiny()
    net.matmul.shard(((1, 2), (2, 2)))
    before = net.w.asnumpy().copy()
    model = ms.Model(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"), nn.SGD(net.trainable_params(), 0.5))
    model.train(1, tiny_data())
    assert not np.array_equal(before, net.w.asnumpy())
    layout = model.train_network.parameter_layout_dict["w"]
    assert layout[2] == [2, 1], layout  # the slice each rank holds of [4, 2] split (2, 2)
    assert "x" not in model.train_network.parameter_layout_dict


def test_a_dynamic_loss_scale_skips_overflowed_steps_and_reports_loss_overflow_and_scale(context):
    ms.set_auto_parallel_context(parallel_mode="semi_auto_parallel", device_num=4)
    net = Tiny()
    net.matmul.shard(((1, 2), (2, 2)))
    before = net.w.asnumpy().copy()
    # 2^200 seeds the backward pass with an infinity in float32: the first step overflows on
    # every device and is skipped; 2^200 / 2^100 fits; after a window of 2 steps it grows back
    # and overflows again.
    manager = ms.DynamicLossScaleManager(init_loss_scale=2.0**200, scale_factor=2**100, scale_window=2)
    seen = []

    class Keep(ms.train.Callback):
        def step_end(self, run_context):
            loss, overflow, scale = run_context.original_args().net_outputs
            seen.append((bool(overflow.asnumpy()), float(scale.asnumpy()), np.array_equal(net.w.asnumpy(), before)))

    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    model = ms.Model(net, loss, nn.SGD(net.trainable_params(), 0.5), loss_scale_manager=manager)
    model.train(1, tiny_data(), callbacks=[Keep(), ms.train.LossMonitor()])
    assert [s[0] for s in seen] == [True, False, False, True], seen
    assert [s[2] for s in seen] == [True, False, False, False], "the skipped step leaves the weight as it was"
    assert [s[1] for s in seen[1:]] == [2.0**100, 2.0**100, np.inf], "a float32 output, as MindSpore's"
    assert manager.get_loss_scale() == 2.0**100

    # FixedLossScaleManager(drop_overflow_update=False) needs the optimizer to divide by its scale.
    with pytest.raises(ValueError, match="loss_scale to be the same value"):
        ms.Model(net, loss, nn.SGD(net.trainable_params(), 0.5), loss_scale_manager=ms.FixedLossScaleManager(8.0, False))
    with pytest.raises(NotImplementedError, match="divides gradients that nothing scaled"):
        ms.Model(net, loss, nn.SGD(net.trainable_params(), 0.5, loss_scale=8.0))
    with pytest.raises(ValueError, match="scale_factor"):
        ms.amp.DynamicLossScaleManager(scale_factor=1)


def test_amp_levels_train_in_half_precision_with_float32_parameters(context):
    ms.set_auto_parallel_context(parallel_mode="semi_auto_parallel", device_num=4)
    losses = {}
    for level, kwargs in [("O0", {}), ("O2", {"cast_model_type": ms.bfloat16}), ("O3", {}), ("O1", {})]:
        net = Tiny()
        net.matmul.shard(((1, 2), (2, 2)))
        seen = []

        class Keep(ms.train.Callback):
            def step_end(self, run_context):
                outputs = run_context.original_args().net_outputs
                seen.append(float((outputs[0] if isinstance(outputs, tuple) else outputs).asnumpy()))

        manager = ms.DynamicLossScaleManager(2**12, 2, 100) if level != "O0" else None
        model = ms.Model(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"), nn.SGD(net.trainable_params(), 0.5),
                         amp_level=level, loss_scale_manager=manager, **kwargs)
        model.train(2, tiny_data(), callbacks=[Keep()])
        assert net.w.asnumpy().dtype == np.float32, level
        losses[level] = seen
    for level in ("O1", "O2", "O3"):
        assert losses[level] != losses["O0"], f"{level} computes in half precision"
        assert np.allclose(losses[level], losses["O0"], rtol=0.02), (level, losses[level], losses["O0"])
    # Evaluation and prediction run in the Model's precision too (outputs in float32).
    x = ms.Tensor(np.random.default_rng(1).standard_normal((8, 4)).astype(np.float32))
    predicted = {}
    for level in ("O0", "O3"):
        net = Tiny()
        model = ms.Model(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"), nn.SGD(net.trainable_params(), 0.5),
                         metrics={"loss"}, amp_level=level)
        predicted[level] = model.predict(x).asnumpy()
        assert predicted[level].dtype == np.float32
        assert model.eval(tiny_data())["loss"] > 0
    assert not np.array_equal(predicted["O3"], predicted["O0"]), "O3 predicts in half precision"
    np.testing.assert_allclose(predicted["O3"], predicted["O0"], rtol=0.02, atol=1e-3)
    with pytest.raises(NotImplementedError, match="keep_batchnorm_fp32"):
        ms.Model(Tiny(), nn.SoftmaxCrossEntropyWithLogits(sparse=True), nn.SGD(Tiny().trainable_params(), 0.5), amp_level="O2",
                 keep_batchnorm_fp32=False)
    with pytest.raises(ValueError, match="amp_level"):
        ms.Model(Tiny(), nn.SoftmaxCrossEntropyWithLogits(sparse=True), nn.SGD(Tiny().trainable_params(), 0.5), amp_level="auto")


def test_a_changed_parameter_reaches_the_running_job(context):
    net = Tiny()
    model = ms.Model(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"), nn.SGD(net.trainable_params(), 0.0))
    model.train(1, tiny_data())
    net.w.set_data(np.zeros((4, 2), np.float32))
    seen = []

    class Keep(ms.train.Callback):
        def step_end(self, run_context):
            seen.append(float(run_context.original_args().net_outputs.asnumpy()))

    model.train(1, tiny_data(), callbacks=[Keep()])
    # Zero weights: equal logits, the loss of two classes is log 2 at every step.
    assert np.allclose(seen, np.log(2.0), atol=1e-6)


def test_a_cell_called_on_values_runs_compiled_and_caches_its_compilation(context):
    net = Tiny()
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    assert np.allclose(net(ms.Tensor(x)).asnumpy(), x @ net.w.asnumpy())
    net.w.set_data(np.ones((4, 2), np.float32))
    assert np.allclose(net(ms.Tensor(x)).asnumpy(), x @ np.ones((4, 2)))  # the new value reaches the compiled cell
    assert len(net._predictors) == 1

    class Peek(nn.Cell):
        def construct(self, x):
            return x.asnumpy()

    with pytest.raises(RuntimeError, match="no value"):
        Peek()(ms.Tensor(np.ones((2, 2), np.float32)))


def test_compile_plans_a_cell_and_fills_its_layout_dict(context):
    ms.set_auto_parallel_context(parallel_mode="semi_auto_parallel", device_num=8)
    net = Tiny()
    net.matmul.shard(((2, 2), (2, 2)))
    net.compile(ms.Tensor(np.ones((8, 4), np.float32)))
    assert net.parameter_layout_dict["w"][2] == [2, 1]


def test_errors_name_what_is_wrong(context):
    with pytest.raises(ValueError, match="no_such_option"):
        ms.set_auto_parallel_context(no_such_option=1)
    with pytest.raises(ValueError, match="divide"):
        ms.set_auto_parallel_context(parallel_mode="semi_auto_parallel", device_num=4)
        net = Tiny()
        net.matmul.shard(((3, 1), (1, 1)))
        ms.Model(net, nn.MSELoss(), nn.SGD(net.trainable_params(), 0.1)).train(1, tiny_data())
    with pytest.raises(TypeError, match="tuple of tuples"):
        ops.MatMul().shard([2, 1])
    with pytest.raises(ValueError, match="cannot be split over 4 devices"):
        Tiny()(ms.Tensor(np.ones((2, 4), np.float32)))  # the context of 4 devices set above
    with pytest.raises(ValueError, match="shape"):
        Tiny().w.set_data(np.ones((3, 3), np.float32))
    twice = Tiny().trainable_params()
    with pytest.raises(RuntimeError, match="w parameter already exists"):
        nn.SGD([{"params": twice}, {"params": twice}], 0.1)
    with pytest.raises(ValueError, match="'momentum'"):
        nn.SGD([{"params": twice, "momentum": 0.9}], 0.1)
    with pytest.raises(NotImplementedError, match="LearningRateSchedule"):
        nn.SGD(twice, Tiny())
    with pytest.raises(AttributeError):
        ops.NoSuchPrimitive()
    ms.reset_auto_parallel_context()
    def model():
        net = Tiny()
        return ms.Model(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"), nn.SGD(net.trainable_params(), 0.1))

    steps = []

    class Count(ms.train.Callback):
        def step_end(self, run_context):
            steps.append(1)

    with pytest.raises(ValueError, match="last batch of each epoch has 2 rows"):
        model().train(1, tiny_data(rows=10, batch=4), callbacks=[Count()])
    assert not steps, "refused before the first step"
    with pytest.raises(ValueError, match="3 columns"):
        data = ds.NumpySlicesDataset({"x": np.ones((8, 4), np.float32), "y": np.zeros(8, np.int32), "z": np.zeros(8)}, shuffle=False)
        model().train(1, data.batch(4))
    ms.set_auto_parallel_context(device_num=4, parallel_mode="data_parallel")
    with pytest.raises(ValueError, match="num_shards=2"):
        data = ds.NumpySlicesDataset({"x": np.ones((8, 4), np.float32), "y": np.zeros(8, np.int32)}, shuffle=False, num_shards=2, shard_id=0)
        model().train(1, data.batch(2))
    ms.reset_auto_parallel_context()
    with pytest.raises(RuntimeError, match="list of 2 steps"):
        net = Tiny()
        data = ds.NumpySlicesDataset({"x": np.ones((12, 4), np.float32), "t": np.zeros((12, 2), np.float32)}, shuffle=False)
        ms.Model(net, nn.MSELoss(), nn.SGD(net.trainable_params(), [0.1, 0.1])).train(1, data.batch(4))
    with pytest.raises(ValueError, match="two parameters named 'w'"):
        class Twice(nn.Cell):
            def __init__(self):
                super().__init__()
                self.a, self.b, self.mm = ms.Parameter(np.ones((4, 2), np.float32), name="w"), ms.Parameter(np.ones((2, 2), np.float32), name="w"), ops.MatMul()

            def construct(self, x):
                return self.mm(self.mm(x, self.a), self.b)

        Twice()(np.ones((2, 4), np.float32))


def write_cifar10(folder, per_file=8, seed=0):
    """A small CIFAR-10 binary folder: records of one label byte and 3072 image bytes."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for name in [f"data_batch_{i}.bin" for i in range(1, 6)] + ["test_batch.bin"]:
        rec = np.zeros((per_file, 3073), np.uint8)
        rec[:, 0] = rng.integers(0, 10, per_file)
        rec[:, 1:] = rng.integers(0, 256, (per_file, 3072))
        rec.tofile(folder / name)
    return folder


def test_cifar10_and_mnist_read_mindspores_files_in_its_order(tmp_path):
    folder = write_cifar10(tmp_path / "cifar")
    records = np.fromfile(folder / "data_batch_2.bin", np.uint8).reshape(-1, 3073)
    d = ds.Cifar10Dataset(str(folder), usage="train", shuffle=False, num_shards=4, shard_id=1)
    rows = list(d.create_tuple_iterator(output_numpy=True))
    assert d.get_col_names() == ["image", "label"] and len(rows) == 10  # 40 records over 4 shards
    image, label = rows[2]  # record 9: the second file's second record
    assert image.shape == (32, 32, 3) and image.dtype == np.uint8 and label.dtype == np.uint32
    assert label == records[1, 0] and np.array_equal(image, records[1, 1:].reshape(3, 32, 32).transpose(1, 2, 0))
    assert ds.Cifar10Dataset(str(folder), usage="all", shuffle=False).get_dataset_size() == 48
    with pytest.raises(ValueError, match="data_batch_1.bin does not exist"):
        ds.Cifar10Dataset(str(tmp_path))
    # MNIST: usage "all" reads the test files first, as MindSpore 2.10 does.
    mnist = tmp_path / "mnist"
    mnist.mkdir()
    for prefix, n, label in [("train", 5, 3), ("t10k", 2, 7)]:
        head = (2051).to_bytes(4, "big") + n.to_bytes(4, "big") + (28).to_bytes(4, "big") * 2
        (mnist / f"{prefix}-images-idx3-ubyte").write_bytes(head + bytes(n * 784))
        (mnist / f"{prefix}-labels-idx1-ubyte").write_bytes((2049).to_bytes(4, "big") + n.to_bytes(4, "big") + bytes([label] * n))
    labels = [int(r[1]) for r in ds.MnistDataset(str(mnist), usage="all", shuffle=False).create_tuple_iterator(output_numpy=True)]
    assert labels == [7, 7, 3, 3, 3, 3, 3]


@pytest.mark.parametrize("mode,accumulation", [("data_parallel", 2), ("auto_parallel", 1)])
def test_the_resnet_tutorial_trains_resnet50_on_a_small_cifar10(tmp_path, mode, accumulation):
    folder = write_cifar10(tmp_path / "cifar-10-batches-bin", per_file=4)
    env = {**os.environ, "RANK_SIZE": "4", "DATA_PATH": str(folder), "MODE": mode, "EPOCHS": "1", "BATCH_SIZE": "2", "IMAGE_SIZE": "32",
           "ACCUMULATION": str(accumulation)}
    script = ROOT / "examples" / "python" / "resnet50_distributed_training.py"
    run = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, env=env, timeout=900)
    assert run.returncode == 0, run.stderr[-4000:]
    losses = [float(line.rsplit(" ", 1)[1]) for line in run.stdout.splitlines() if line.startswith("epoch: 1 step:")]
    assert len(losses) == 3 and all(np.isfinite(losses)), run.stdout  # usage "all": 24 images, 4 ranks of batches of 2
    assert (tmp_path / "ckpt_0" / "auto_parallel-1_3.ckpt").is_file()
    saved = ms.load_checkpoint(str(tmp_path / "ckpt_0" / "auto_parallel-1_3.ckpt"))
    assert "layer4.2.bn3.gamma" in saved and saved["fc.weight"].shape == (10, 2048)


def test_pipeline_stages_and_cell_shard_train_as_one_device_does(tmp_path):
    script = Path(__file__).parent / "scripts" / "stages_and_cell_shard.py"
    got = {}
    for mode in ("one", "pipeline", "cellshard"):
        run = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, env={**os.environ, "MODE": mode},
                             timeout=600)
        assert run.returncode == 0, f"{mode}: {run.stderr[-4000:]}"
        got[mode] = run.stdout
    losses = {m: json.loads(out.splitlines()[0].split(" ", 1)[1]) for m, out in got.items()}
    assert_close(losses["pipeline"], losses["one"], "2 pipeline stages beside one device")
    assert_close(losses["cellshard"], losses["one"], "Cell.shard under sharding propagation beside one device")
    # The block's weight took its layout from the cell's input layout ((2, 2): its columns split 2 ways).
    assert "[16, 4]" in got["cellshard"].splitlines()[1]


def test_the_sync_pipeline_shared_parameters_example_runs_on_2_stages(tmp_path):
    script = ROOT / "examples" / "python" / "sync_pipeline_shared_parameters.py"
    run = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-4000:]
    lines = run.stdout.splitlines()
    assert lines[:4] == ["[[1. 1. 1. 1.]", " [1. 1. 1. 1.]", " [1. 1. 1. 1.]", " [1. 1. 1. 1.]]"]
    assert lines[4] == "[4. 4. 4. 4.]"  # the head's product with the table shared across the stages


def test_callbacks_see_the_parameters_of_the_step_and_iterators_restart_each_epoch(context):
    net = Tiny()
    seen = []

    class Peek(ms.train.Callback):
        def step_end(self, run_context):
            seen.append(float(run_context.original_args().network.w.asnumpy()[0, 0]))

    model = ms.Model(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"), nn.SGD(net.trainable_params(), 0.5))
    model.train(1, tiny_data(), callbacks=[Peek()])
    assert len(set(seen)) == len(seen) == 4, seen  # every step's own value, not the starting one
    assert seen[-1] == float(net.w.asnumpy()[0, 0])
    it = tiny_data(rows=8, batch=4).create_tuple_iterator(num_epochs=2)
    assert [len([b for b in it]) for _ in range(2)] == [2, 2]


def test_batchnorm_momentum_means_what_each_of_mindspores_forms_says():
    # MindSpore 2.10: ops.BatchNorm(momentum=m) keeps (1 - m) of the moving mean; nn.BatchNorm2d(momentum=m) keeps m.
    x = np.arange(16, dtype=np.float32).reshape(2, 2, 2, 2)

    class Prim(nn.Cell):
        def __init__(self):
            super().__init__()
            self.g, self.b = ms.Parameter(np.ones(2, np.float32), name="g"), ms.Parameter(np.zeros(2, np.float32), name="b")
            self.m = ms.Parameter(np.full(2, 10.0, np.float32), name="m", requires_grad=False)
            self.v = ms.Parameter(np.ones(2, np.float32), name="v", requires_grad=False)
            self.bn = ops.BatchNorm(is_training=True, momentum=0.1)

        def construct(self, x):
            return self.bn(x, self.g, self.b, self.m, self.v)[0]

    batch_mean = x.transpose(1, 0, 2, 3).reshape(2, -1).mean(axis=1)
    for cell, keep in ((Prim(), 0.9), (nn.BatchNorm2d(2, momentum=0.75, moving_mean_init=10.0), 0.75)):
        cell.set_train(True)
        data = ds.NumpySlicesDataset({"x": x, "t": np.zeros_like(x)}, shuffle=False).batch(2)
        ms.Model(cell, nn.MSELoss(), nn.SGD(cell.trainable_params(), 0.0)).train(1, data)
        moving = cell.m if isinstance(cell, Prim) else cell.moving_mean
        assert np.allclose(moving.asnumpy(), keep * 10.0 + (1 - keep) * batch_mean, atol=1e-5), (keep, moving.asnumpy())


def test_a_script_writes_the_strategy_file_its_context_asks_for(tmp_path, context):
    path = tmp_path / "strategy.ckpt"
    ms.set_auto_parallel_context(parallel_mode="semi_auto_parallel", device_num=4, strategy_ckpt_config={"save_file": str(path)})
    net = Tiny()
    net.matmul.shard(((1, 2), (2, 2)))
    model = ms.Model(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"), nn.Momentum(net.trainable_params(), 0.1, 0.9))
    model.train(1, tiny_data())
    assert path.is_file()
    assert ms.rank_list_for_transform(0, str(path), str(path)) == [0]  # a strategy file MindSpore's functions read
    # The optimizer's state is laid out as its parameter, under MindSpore's name.
    assert model.train_network.parameter_layout_dict["moments.w"][:3] == model.train_network.parameter_layout_dict["w"][:3]


class LayoutNet(nn.Cell):
    """MindSpore's Layout example: one dimension of the weight split along two named axes."""

    def __init__(self, layouts):
        super().__init__()
        rng = np.random.default_rng(3)
        self.w = ms.Parameter(ms.Tensor(rng.standard_normal((8, 16)).astype(np.float32) * 0.3), name="w")
        self.matmul = ops.MatMul()
        self.relu = ops.ReLU()
        if layouts:
            layout = ms.Layout((2, 2, 2), ("dp", "sp", "mp"))
            self.matmul.shard(in_strategy=(layout("dp", "None"), layout("None", ("mp", "sp"))))
            self.relu.shard((layout(("dp", "sp"), "mp"),))

    def construct(self, x):
        return self.relu(self.matmul(x, self.w))


def layout_run(devices, cell=False):
    ms.reset_auto_parallel_context()
    if devices > 1:
        ms.set_auto_parallel_context(parallel_mode="semi_auto_parallel", device_num=devices, full_batch=True)
    net = LayoutNet(devices > 1 and not cell)
    if cell:
        # Cell.shard with a Layout: the input's rows split along two named axes.
        net.shard((ms.Layout((2, 4), ("dp", "mp"))(("mp", "dp"), "None"),))
    losses = []

    class Keep(ms.train.Callback):
        def step_end(self, run_context):
            losses.append(float(run_context.original_args().net_outputs.asnumpy()))

    rng = np.random.default_rng(4)
    data = ds.NumpySlicesDataset({"x": rng.standard_normal((32, 8)).astype(np.float32), "y": rng.integers(0, 16, 32).astype(np.int32)},
                                 shuffle=False).batch(8)
    model = ms.Model(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"), nn.Momentum(net.trainable_params(), 0.1, 0.9))
    model.train(2, data, callbacks=[Keep()])
    return losses, net.w.asnumpy().copy(), model.train_network.parameter_layout_dict


def test_layouts_name_the_axes_that_split_each_dimension(context):
    want_losses, want_w, _ = layout_run(1)
    losses, w, layouts = layout_run(8)
    np.testing.assert_allclose(losses, want_losses, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(w, want_w, rtol=1e-5, atol=1e-6)
    # MindSpore's layout of w: device matrix [2, 2, 2], columns split 4 ways along mp then sp.
    assert layouts["w"][0] == [2, 2, 2], layouts["w"]
    assert layouts["w"][2] == [8, 4], layouts["w"]
    losses, w, _ = layout_run(8, cell=True)
    np.testing.assert_allclose(losses, want_losses, rtol=1e-5, atol=1e-6)
    lay = ms.Layout((2, 2, 2), ("dp", "sp", "mp"))
    assert lay("dp", ("mp", "sp")).to_dict()["tensor_map"] == (2, (0, 1))
    with pytest.raises(ValueError, match="not found"):
        lay("dp", "tp")
    with pytest.raises(ValueError, match="more than one"):
        lay("dp", "dp")
    with pytest.raises(ValueError, match="last dim"):
        ms.Layout((2, 2), ("interleaved_parallel", "mp"))
    with pytest.raises(TypeError, match="all Layouts or all tuples"):
        ops.MatMul().shard((lay("dp", "None"), (1, 1)))


def test_a_layout_that_does_not_fit_its_op_says_why(context):
    ms.set_auto_parallel_context(parallel_mode="semi_auto_parallel", device_num=8, full_batch=True)
    net = Tiny()
    lay = ms.Layout((2, 4), ("dp", "mp"))
    # The contracted dimension split along mp by x and not at all by w.
    net.matmul.shard((lay("dp", "mp"), lay("None", "None")))
    model = ms.Model(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"), nn.SGD(net.trainable_params(), 0.5))
    with pytest.raises(Exception, match=r'invalid layout Layout\(\(2, 4\), \("dp", "mp"\)\)(.|\n)*split 1 ways but another input splits the same dimension 4 ways'):
        model.train(1, tiny_data())


def out_strategy_run(devices, out, inp=((2, 4), (4, 1))):
    ms.reset_auto_parallel_context()
    if devices > 1:
        ms.set_auto_parallel_context(parallel_mode="semi_auto_parallel", device_num=devices, full_batch=True)
    net = LayoutNet(False)
    if devices > 1:
        # The contracted dimension split 4 ways: the product's pending sum reduce-scattered
        # over the rows (out_strategy) instead of all-reduced.
        net.matmul.shard(in_strategy=inp, out_strategy=out)
    rng = np.random.default_rng(4)
    data = ds.NumpySlicesDataset({"x": rng.standard_normal((32, 8)).astype(np.float32), "y": rng.integers(0, 16, 32).astype(np.int32)},
                                 shuffle=False).batch(8)
    model = ms.Model(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"), nn.Momentum(net.trainable_params(), 0.1, 0.9))
    model.train(2, data)
    return net.w.asnumpy().copy()


def test_an_out_strategy_lays_the_output_out_as_asked(context):
    want = out_strategy_run(1, None)
    np.testing.assert_allclose(out_strategy_run(8, ((8, 1),)), want, rtol=1e-5, atol=1e-6)
    lay = ms.Layout((2, 4), ("dp", "mp"))
    inp = (lay("dp", "mp"), lay("mp", "None"))
    np.testing.assert_allclose(out_strategy_run(8, (lay(("dp", "mp"), "None"),), inp), want, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="in_strategy type must equal"):
        ops.MatMul().shard(in_strategy=((2, 4), (4, 1)), out_strategy=(lay(("dp", "mp"), "None"),))
    with pytest.raises(Exception, match="out_strategy"):
        out_strategy_run(8, ((3, 1),))


class CastNet(Tiny):
    def __init__(self):
        super().__init__()
        # A cast to the dtype the input has is no op: it cannot lay out an output.
        self.cast = ops.Cast().shard(((1, 1),), out_strategy=((2, 1),))

    def construct(self, x):
        return self.matmul(self.cast(x, ms.float32), self.w)


def test_an_out_strategy_that_cannot_be_applied_is_refused(context):
    ms.set_auto_parallel_context(parallel_mode="semi_auto_parallel", device_num=2)
    net = CastNet()
    model = ms.Model(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"), nn.SGD(net.trainable_params(), 0.5))
    with pytest.raises(NotImplementedError, match="out_strategy"):
        model.train(1, tiny_data())


def test_functional_training_gradients_stay_on_the_ranks_until_read_and_refuses_what_it_does_not_run(context):
    ms.set_auto_parallel_context(parallel_mode="data_parallel", device_num=4)
    net = Tiny()
    loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    opt = nn.SGD(net.trainable_params(), 0.5)
    grad_fn = ms.value_and_grad(lambda x, y: loss_fn(net(x), y), None, opt.parameters)
    x, y = ms.Tensor(np.ones((8, 4), np.float32)), ms.Tensor(np.array([0, 1] * 4, np.int32))
    before = net.w.asnumpy().copy()
    loss, grads = grad_fn(x, y)
    assert grads[0].shape == (4, 2) and grads[0]._value is None, "read only when looked at"
    g = grads[0].asnumpy().copy()
    opt(grads)
    np.testing.assert_allclose(net.w.asnumpy(), before - 0.5 * g, rtol=1e-6)
    # A gradient of an earlier step cannot be read once the next step ran.
    _, old = grad_fn(x, y)
    grad_fn(x, y)
    with pytest.raises(RuntimeError, match="earlier step"):
        old[0].asnumpy()
    # The gradients the script computes itself are what the optimizer applies.
    _, grads = grad_fn(x, y)
    before = net.w.asnumpy().copy()
    g = grads[0].asnumpy().copy()
    opt(tuple(t * 0 for t in grads))
    np.testing.assert_array_equal(net.w.asnumpy(), before)
    with pytest.raises(NotImplementedError, match="grad_position=None"):
        ms.value_and_grad(lambda x: net(x), 0, opt.parameters)
    with pytest.raises(ValueError, match="weights"):
        ms.grad(lambda x: net(x), None)
    with pytest.raises(NotImplementedError, match="has_aux=True"):
        ms.value_and_grad(lambda x, y: (loss_fn(net(x), y), net(x)), None, opt.parameters)(x, y)
    _, unread = grad_fn(x, y)
    opt(unread)
    with pytest.raises(RuntimeError, match="applied before it was read"):
        unread[0].asnumpy()
    # DistributedGradReducer: MindSpore's sum (gradients_mean unset) is the job's mean times 4;
    # its mean=True is the job's own.
    _, grads = grad_fn(x, y)
    mean = grads[0].asnumpy().copy()
    np.testing.assert_allclose(nn.DistributedGradReducer(opt.parameters)(grads)[0].asnumpy(), 4 * mean, rtol=1e-6)
    assert nn.DistributedGradReducer(opt.parameters, mean=True)(grads) is grads
    opt(grads)
    # A gradient of another shape than its parameter is refused before it reaches the ranks.
    _, grads = grad_fn(x, y)
    with pytest.raises(ValueError, match="shape"):
        opt((ms.Tensor(np.zeros((2, 2), np.float32)),))
    opt(grads)
    # The optimizer's state stays in the job of the first input shapes: a batch of other rows
    # compiles another job, whose update is refused.
    _, other_rows = grad_fn(ms.Tensor(np.ones((4, 4), np.float32)), ms.Tensor(np.array([0, 1] * 2, np.int32)))
    with pytest.raises(NotImplementedError, match="drop_remainder=True"):
        opt(other_rows)
    # Gradients are applied once, by the optimizer of their parameters.
    with pytest.raises(RuntimeError, match="no gradients to apply"):
        opt(grads)
    _, grads = grad_fn(x, y)
    with pytest.raises(ValueError, match="other parameters"):
        nn.SGD(Tiny().trainable_params(), 0.1)(grads)
    with pytest.raises(RuntimeError, match="value_and_grad"):
        nn.SGD(Tiny().trainable_params(), 0.1)([ms.Tensor(np.zeros((4, 2), np.float32))])


def test_functional_training_over_a_sharded_dataset_takes_every_ranks_rows(context):
    """MindSpore's data-parallel tutorial loop: each rank reads its shard (num_shards=get_group_size(),
    shard_id=get_rank()), value_and_grad, DistributedGradReducer, the optimizer. The one process
    running the 4 ranks computes on their batches joined: one device on the same rows, batched 4
    times larger, gives the same run."""
    rng = np.random.default_rng(9)
    x, y = rng.standard_normal((64, 4)).astype(np.float32), rng.integers(0, 2, 64).astype(np.int32)

    def run(devices):
        ms.reset_auto_parallel_context()
        if devices > 1:
            ms.set_auto_parallel_context(parallel_mode="data_parallel", gradients_mean=True, device_num=devices)
        ms.communication.init()
        n, r = ms.communication.get_group_size(), ms.communication.get_rank()
        shards = {"num_shards": n, "shard_id": r} if n > 1 else {}
        data = ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False, **shards).batch(16 // n)
        net = Tiny()
        loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
        opt = nn.Momentum(net.trainable_params(), 0.1, 0.9)
        grad_fn = ms.value_and_grad(lambda a, b: loss_fn(net(a), b), None, opt.parameters)
        reducer = nn.DistributedGradReducer(opt.parameters)
        losses = []
        for a, b in data.create_tuple_iterator():
            loss, grads = grad_fn(a, b)
            opt(reducer(grads))
            losses.append(float(loss.asnumpy()))
        return losses, net.w.asnumpy()

    # Unbatched rows of a sharded dataset are read as they are (no global batch to join).
    ms.set_auto_parallel_context(parallel_mode="data_parallel", device_num=4)
    rows = list(ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False, num_shards=4, shard_id=1).create_tuple_iterator())
    assert len(rows) == 16 and not hasattr(rows[0][1], "_global")
    (l1, w1), (l4, w4) = run(1), run(4)
    assert len(l1) == len(l4) == 4
    np.testing.assert_allclose(l4, l1, rtol=1e-5)
    np.testing.assert_allclose(w4, w1, rtol=1e-5)


@pytest.mark.parametrize("devices", [1, 4])
def test_a_model_checkpoint_holds_the_optimizer_state_and_resumes_it(tmp_path, context, devices):
    """ModelCheckpoint saves the optimizer's state under MindSpore's names (moment1.w, ...,
    global_step, learning_rate, beta powers); loaded into a new network and optimizer, training
    continues as if it never stopped."""
    from autopar.train import ModelCheckpoint, CheckpointConfig

    if devices > 1:
        ms.set_auto_parallel_context(parallel_mode="data_parallel", device_num=devices)

    def model():
        net = Tiny()
        opt = nn.Adam(net.trainable_params(), 0.05)
        return net, opt, ms.Model(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"), opt)

    net, _, m = model()
    m.train(2, tiny_data())
    whole = net.w.asnumpy().copy()
    net, _, m = model()
    m.train(1, tiny_data(), callbacks=[ModelCheckpoint(prefix="t", directory=str(tmp_path), config=CheckpointConfig(save_checkpoint_steps=4))])
    saved = ms.load_checkpoint(str(tmp_path / "t-1_4.ckpt"))
    assert {"w", "moment1.w", "moment2.w", "global_step", "learning_rate", "beta1_power", "beta2_power"} <= set(saved), sorted(saved)
    assert int(saved["global_step"].asnumpy()[0]) == 4
    # Shapes as MindSpore 2.10 writes them: global_step [1], the others scalars.
    assert saved["global_step"].shape == (1,) and saved["beta1_power"].shape == () and saved["learning_rate"].shape == ()
    net, opt, m = model()
    ms.load_param_into_net(net, saved)
    assert ms.load_param_into_net(opt, saved)[0] == []
    m.train(1, tiny_data())
    np.testing.assert_allclose(net.w.asnumpy(), whole, rtol=1e-6, atol=1e-7)
    # Without the optimizer's state the run differs (the check sees the state).
    net, _, m = model()
    ms.load_param_into_net(net, saved)
    m.train(1, tiny_data())
    assert not np.allclose(net.w.asnumpy(), whole, rtol=1e-6, atol=1e-7)


def test_sgd_and_momentum_checkpoints_hold_mindspores_keys_and_an_earlier_step_loads_into_a_trained_optimizer(tmp_path, context):
    from autopar.train import ModelCheckpoint, CheckpointConfig

    for make, keys in [(lambda ps: nn.SGD(ps, 0.1, momentum=0.9), {"accum.w", "stat.w", "momentum"}),
                       (lambda ps: nn.Momentum(ps, 0.1, 0.9), {"moments.w", "momentum"})]:
        net = Tiny()
        opt = make(net.trainable_params())
        m = ms.Model(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"), opt)
        cfg = CheckpointConfig(save_checkpoint_steps=2, keep_checkpoint_max=10)
        m.train(1, tiny_data(), callbacks=[ModelCheckpoint(prefix="s", directory=str(tmp_path), config=cfg)])
        early = ms.load_checkpoint(str(tmp_path / "s-1_2.ckpt"))
        assert keys | {"w", "global_step", "learning_rate"} <= set(early), sorted(early)
        # Moved back to step 2 on the same running Model: its next steps are those after step 2.
        ms.load_param_into_net(net, early, strict_load=True)
        assert ms.load_param_into_net(opt, early, strict_load=True)[0] == []
        m.train(1, tiny_data())
        again = net.w.asnumpy().copy()
        fresh = Tiny()
        fresh_opt = make(fresh.trainable_params())
        ms.load_param_into_net(fresh, early)
        ms.load_param_into_net(fresh_opt, early)
        ms.Model(fresh, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"), fresh_opt).train(1, tiny_data())
        np.testing.assert_allclose(again, fresh.w.asnumpy(), rtol=1e-6)


def test_functional_mixed_precision_with_a_dynamic_loss_scaler(context):
    """MindSpore's functional mixed precision: auto_mixed_precision(net, level), the loss scaled
    in the forward function, the gradients checked by all_finite, unscaled and applied, the scale
    adjusted; an overflow skips the update and lowers the scale."""
    from autopar.amp import DynamicLossScaler, all_finite, auto_mixed_precision

    ms.set_auto_parallel_context(parallel_mode="data_parallel", device_num=2)
    rng = np.random.default_rng(4)
    x, y = ms.Tensor(rng.standard_normal((8, 4)).astype(np.float32)), ms.Tensor(rng.integers(0, 2, 8).astype(np.int32))

    def run(level, scale):
        net = Tiny()
        if level:
            auto_mixed_precision(net, level)
        loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
        opt = nn.SGD(net.trainable_params(), 0.5)
        scaler = DynamicLossScaler(scale, 2, 2)
        grad_fn = ms.value_and_grad(lambda a, b: scaler.scale(loss_fn(net(a), b)), None, opt.parameters)
        losses, finite = [], []
        for _ in range(4):
            loss, grads = grad_fn(x, y)
            ok = all_finite(grads)
            if ok:
                opt(scaler.unscale(grads))
            scaler.adjust(ok)
            losses.append(float(scaler.unscale(loss).asnumpy()))
            finite.append(bool(ok.asnumpy()))
        return losses, finite, scaler.scale_value, net.w.asnumpy()

    f32 = run(None, 1024.0)
    half = run("O3", 1024.0)
    assert all(f32[1]) and all(half[1])
    assert f32[2] == half[2] == 4096.0, "doubled after each window of 2 finite steps"
    assert half[0] != f32[0], "O3 computes in half precision"
    np.testing.assert_allclose(half[0], f32[0], rtol=0.02)
    np.testing.assert_allclose(half[3], f32[3], rtol=0.02, atol=1e-3)
    # float16 gradients of a loss scaled by 2**40 overflow: no update, the scale lowered.
    over = run("O3", 2.0**40)
    assert not over[1][0] and over[2] < 2.0**40
    if not any(over[1]):
        np.testing.assert_array_equal(over[3], Tiny().w.asnumpy())


class Wide(nn.Cell):
    def __init__(self):
        super().__init__()
        self.w = ms.Parameter(ms.Tensor(np.full((64, 512), 0.01, np.float32)), name="w")
        self.matmul = ops.MatMul()

    def construct(self, x):
        return self.matmul(x, self.w)


def test_the_searchs_algorithm_and_cost_model_parameters_reach_dynamic_programming(context):
    from autopar.parallel import _cost_model_context as cost_model_context
    from autopar.parallel import get_algo_parameters, reset_algo_parameters, set_algo_parameters

    # MindSpore 2.10's defaults.
    assert get_algo_parameters("fully_use_devices") is False
    assert cost_model_context.get_cost_model_context("costmodel_beta") == 400.0
    ms.set_auto_parallel_context(parallel_mode="auto_parallel", search_mode="dynamic_programming", device_num=8, full_batch=True)

    def weight_layout():
        net = Wide()
        net.compile(ms.Tensor(np.ones((8, 64), np.float32)))
        return net.parameter_layout_dict["w"][2]

    try:
        # A whole batch of 8 rows: MindSpore's costs split the weight's columns over every
        # device rather than compute with it whole.
        assert weight_layout() == [64, 64]
        set_algo_parameters(fully_use_devices=True)
        assert get_algo_parameters("fully_use_devices") is True
        # A device too small for any strategy: the search says so, naming the capacity.
        cost_model_context.set_cost_model_context(device_memory_capacity=1024)
        with pytest.raises(Exception, match="device_memory_capacity"):
            weight_layout()
        cost_model_context.reset_cost_model_context()
        assert cost_model_context.get_cost_model_context("device_memory_capacity") == float(16 << 30)
        assert weight_layout() == [64, 64]
        # Outside auto_parallel the search's parameters are ignored, as MindSpore ignores them.
        cost_model_context.set_cost_model_context(device_memory_capacity=1024)
        ms.reset_auto_parallel_context()
        ms.set_auto_parallel_context(parallel_mode="semi_auto_parallel", device_num=8, full_batch=True)
        assert weight_layout() == [64, 512]
        # What autopar's search does not do is refused, naming it.
        with pytest.raises(ValueError, match="enable_algo_approxi"):
            set_algo_parameters(enable_algo_approxi=True)
        with pytest.raises(ValueError, match="costmodel_communi_bias"):
            cost_model_context.set_cost_model_context(costmodel_communi_bias=1.0)
        with pytest.raises(ValueError, match="no_such_key"):
            set_algo_parameters(no_such_key=1)
        # The parameters outlive a reset of the auto-parallel context, as MindSpore's do.
        ms.reset_auto_parallel_context()
        assert get_algo_parameters("fully_use_devices") is True
    finally:
        reset_algo_parameters()
        cost_model_context.reset_cost_model_context()
