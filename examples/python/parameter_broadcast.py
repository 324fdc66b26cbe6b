"""The example of MindSpore's `parameter_broadcast` document, with `mindspore` changed to
`autopar` and the `create_dataset` it leaves to the reader written out (MNIST-sized images of
numpy, sharded by rank as a launcher's processes would read them).

    RANK_SIZE=8 RANK_ID=0 python examples/python/parameter_broadcast.py

Without a launcher, autopar runs the RANK_SIZE ranks as simulated devices of this process.
"""
import os

import numpy as np

import autopar as ms
import autopar.dataset as ds
from autopar import nn, ops
from autopar.communication import init, get_group_size, get_rank
from autopar.common.initializer import initializer
from autopar.train import Model, Callback
from autopar.parallel.parameter_broadcast import parameter_broadcast
from autopar.train.serialization import load_checkpoint, load_param_into_net


def create_dataset(batch_size=32, samples=512):
    rng = np.random.default_rng(0)
    images = rng.random((samples, 1, 28, 28), dtype=np.float32)
    labels = (images.reshape(samples, -1)[:, :10].argmax(axis=1)).astype(np.int32)
    data = ds.NumpySlicesDataset({"image": images, "label": labels}, shuffle=False, num_shards=get_group_size(), shard_id=get_rank())
    return data.batch(batch_size, drop_remainder=True)


ms.set_context(mode=ms.GRAPH_MODE)
ms.set_context(max_device_memory="28GB")
ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.SEMI_AUTO_PARALLEL)
init()
ms.set_seed(1)
class Network(nn.Cell):
    def __init__(self):
        super().__init__()
        self.flatten = ops.Flatten()
        self.fc1_weight = ms.Parameter(initializer("normal", [28*28, 512], ms.float32))
        self.fc2_weight = ms.Parameter(initializer("normal", [512, 512], ms.float32))
        self.fc3_weight = ms.Parameter(initializer("normal", [512, 10], ms.float32))
        self.matmul1 = ops.MatMul()
        self.relu1 = ops.ReLU()
        self.matmul2 = ops.MatMul()
        self.relu2 = ops.ReLU()
        self.matmul3 = ops.MatMul()
    def construct(self, x):
        x = self.flatten(x)
        x = self.matmul1(x, self.fc1_weight)
        x = self.relu1(x)
        x = self.matmul2(x, self.fc2_weight)
        x = self.relu2(x)
        logits = self.matmul3(x, self.fc3_weight)
        return logits
net = Network()
net.matmul1.shard(((2, 4), (4, 1)))
net.relu1.shard(((4, 1),))
net.matmul2.shard(((1, 8), (8, 1)))
net.relu2.shard(((8, 1),))
# Create the dataset taking MNIST as an example. Refer to
# https://gitee.com/mindspore/docs/blob/r2.4.10/docs/mindspore/code/mnist.py
dataset = create_dataset()
optim = nn.SGD(net.trainable_params(), 1e-2)
loss = nn.CrossEntropyLoss()
model = Model(net, loss_fn=loss, optimizer=optim)
model.train(1, dataset)
ms.save_checkpoint(net, "./simple.ckpt", False)
layout = model.train_network.parameter_layout_dict
param_dict = load_checkpoint("./simple.ckpt")
load_param_into_net(net, param_dict)
rank_id = os.environ["RANK_ID"]
parameter_broadcast(model.train_network, layout, int(rank_id), 0)
class LossCallBack(Callback):
    def step_end(self, run_context):
        cb_params = run_context.original_args()
        print("step end, cur step num: ", cb_params.cur_step_num, flush=True)
model.train(1, dataset, callbacks=[LossCallBack()])
