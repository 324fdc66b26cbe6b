"""A network of three blocks trained with micro-batches: MODE=one on one device (gradient
accumulation), MODE=pipeline on 2 stages of 2 devices (PipelineCell, cell.pipeline_stage),
MODE=cellshard under sharding propagation from Cell.shard's input layout. autopar's own
script (MindSpore's CPU build runs neither pipelines nor model parallelism)."""
import os, numpy as np
import autopar as ms
import autopar.dataset as ds
from autopar import nn, ops
from autopar.train import Model, Callback
mode = os.environ["MODE"]
if mode == "pipeline":
    ms.set_auto_parallel_context(parallel_mode="semi_auto_parallel", device_num=4, pipeline_stages=2, full_batch=True)
elif mode == "cellshard":
    ms.set_auto_parallel_context(parallel_mode="auto_parallel", search_mode="sharding_propagation", device_num=4, full_batch=True)
rng = np.random.default_rng(7)
x = rng.standard_normal((32, 8)).astype(np.float32); y = rng.integers(0, 4, 32).astype(np.int32)
class Block(nn.Cell):
    def __init__(self, i, o):
        super().__init__()
        self.fc = nn.Dense(i, o, weight_init=ms.Tensor(rng.standard_normal((o, i)).astype(np.float32) * 0.4), bias_init="zeros")
        self.act = nn.Tanh()
    def construct(self, x):
        return self.act(self.fc(x))
class Net(nn.Cell):
    def __init__(self):
        super().__init__()
        self.b1 = Block(8, 16); self.b2 = Block(16, 16); self.head = nn.Dense(16, 4, weight_init=ms.Tensor(rng.standard_normal((4, 16)).astype(np.float32) * 0.4), bias_init="zeros")
    def construct(self, x):
        return self.head(self.b2(self.b1(x)))
net = Net()
if mode == "pipeline":
    net.b1.pipeline_stage = 0; net.b2.pipeline_stage = 1; net.head.pipeline_stage = 1
if mode == "cellshard":
    net.b1.shard(((2, 2),))
losses = []
class Keep(Callback):
    def step_end(self, rc): losses.append(float(rc.original_args().net_outputs.asnumpy()))
loss_net = nn.WithLossCell(net, nn.CrossEntropyLoss())
wrapped = nn.PipelineCell(loss_net, 4) if mode == "pipeline" else nn.GradAccumulationCell(loss_net, 4)
model = Model(wrapped, optimizer=nn.Momentum(net.trainable_params(), 0.1, 0.9))
model.train(2, ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(16), callbacks=[Keep()])
print("LOSSES", losses)
if mode == "cellshard":
    print(sorted(k for k in model.train_network.parameter_layout_dict)[:3], model.train_network.parameter_layout_dict["b1.fc.weight"][:3])
