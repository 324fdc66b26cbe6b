"""The ResNet tutorial's training script (ResNet-50 on CIFAR-10, data parallel or auto
parallel), with `mindspore` changed to `autopar`. Without a launcher, the ranks are simulated
devices of this process: RANK_SIZE of them.

    RANK_SIZE=8 DATA_PATH=cifar-10-batches-bin python examples/python/resnet50_distributed_training.py

MODE=data_parallel (the default: auto_parallel), EPOCHS, BATCH_SIZE, IMAGE_SIZE (the tutorial
resizes to 224) and ACCUMULATION (micro-batches of gradient accumulation) change what the
tutorial fixes, so that a small data set trains in seconds.
"""
import os

import autopar.nn as nn
import autopar.ops as ops
import autopar.dataset as ds
import autopar.dataset.transforms.c_transforms as C
import autopar.dataset.vision.c_transforms as vision
from autopar import Tensor, context
from autopar import dtype as mstype
from autopar.communication import get_group_size, get_rank, init
from autopar.context import ParallelMode
from autopar.nn import Momentum
from autopar.train import Model
from autopar.train.callback import CheckpointConfig, LossMonitor, ModelCheckpoint
from resnet import resnet50

context.set_context(mode=context.GRAPH_MODE, device_target="CPU")
init()
IMAGE_SIZE = int(os.environ.get("IMAGE_SIZE", "224"))


def create_dataset(data_path, repeat_num=1, batch_size=32, rank_id=0, rank_size=1):
    resize_height = IMAGE_SIZE
    resize_width = IMAGE_SIZE
    rescale = 1.0 / 255.0
    shift = 0.0
    # get rank_id and rank_size
    rank_id = get_rank()
    rank_size = get_group_size()
    data_set = ds.Cifar10Dataset(data_path, num_shards=rank_size, shard_id=rank_id)
    # define map operations
    random_crop_op = vision.RandomCrop((32, 32), (4, 4, 4, 4))
    random_horizontal_op = vision.RandomHorizontalFlip()
    resize_op = vision.Resize((resize_height, resize_width))
    rescale_op = vision.Rescale(rescale, shift)
    normalize_op = vision.Normalize((0.4465, 0.4822, 0.4914), (0.2010, 0.1994, 0.2023))
    changeswap_op = vision.HWC2CHW()
    type_cast_op = C.TypeCast(mstype.int32)
    c_trans = [random_crop_op, random_horizontal_op]
    c_trans += [resize_op, rescale_op, normalize_op, changeswap_op]
    # apply map operations on images
    data_set = data_set.map(operations=type_cast_op, input_columns="label")
    data_set = data_set.map(operations=c_trans, input_columns="image")
    # apply shuffle operations
    data_set = data_set.shuffle(buffer_size=10)
    # apply batch operations
    data_set = data_set.batch(batch_size=batch_size, drop_remainder=True)
    # apply repeat operations
    data_set = data_set.repeat(repeat_num)
    return data_set


class SoftmaxCrossEntropyExpand(nn.Cell):
    def __init__(self, sparse=False):
        super(SoftmaxCrossEntropyExpand, self).__init__()
        self.exp = ops.Exp()
        self.sum = ops.ReduceSum(keep_dims=True)
        self.onehot = ops.OneHot()
        self.on_value = Tensor(1.0, mstype.float32)
        self.off_value = Tensor(0.0, mstype.float32)
        self.div = ops.Div()
        self.log = ops.Log()
        self.sum_cross_entropy = ops.ReduceSum(keep_dims=False)
        self.mul = ops.Mul()
        self.mul2 = ops.Mul()
        self.mean = ops.ReduceMean(keep_dims=False)
        self.sparse = sparse
        self.max = ops.ReduceMax(keep_dims=True)
        self.sub = ops.Sub()

    def construct(self, logit, label):
        logit_max = self.max(logit, -1)
        exp = self.exp(self.sub(logit, logit_max))
        exp_sum = self.sum(exp, -1)
        softmax_result = self.div(exp, exp_sum)
        if self.sparse:
            label = self.onehot(label, ops.shape(logit)[1], self.on_value, self.off_value)
        softmax_result_log = self.log(softmax_result)
        loss = self.sum_cross_entropy((self.mul(softmax_result_log, label)), -1)
        loss = self.mul2(ops.scalar_to_array(-1.0), loss)
        loss = self.mean(loss, -1)
        return loss


def test_train_cifar(epoch_size=10):
    mode = os.environ.get("MODE", "auto_parallel")
    parallel_mode = ParallelMode.DATA_PARALLEL if mode == "data_parallel" else ParallelMode.AUTO_PARALLEL
    context.set_auto_parallel_context(parallel_mode=parallel_mode, gradients_mean=True)
    loss_cb = LossMonitor()
    data_path = os.environ["DATA_PATH"]
    batch_size = int(os.environ.get("BATCH_SIZE", "32"))
    dataset = create_dataset(data_path, batch_size=batch_size)
    num_classes = 10
    net = resnet50(batch_size, num_classes)
    loss = SoftmaxCrossEntropyExpand(sparse=True)
    opt = Momentum(filter(lambda x: x.requires_grad, net.get_parameters()), 0.01, 0.9)
    ckpt_config = CheckpointConfig(keep_checkpoint_max=1)
    ckpt_callback = ModelCheckpoint(prefix="auto_parallel", directory="./ckpt_" + str(get_rank()) + "/", config=ckpt_config)
    accumulation = int(os.environ.get("ACCUMULATION", "1"))
    if accumulation > 1:
        # Gradient accumulation: each batch's gradients in `accumulation` micro-batches, one update.
        model = Model(nn.GradAccumulationCell(nn.WithLossCell(net, loss), accumulation), optimizer=opt)
    else:
        model = Model(net, loss_fn=loss, optimizer=opt)
    model.train(epoch_size, dataset, callbacks=[loss_cb, ckpt_callback], dataset_sink_mode=True)


if __name__ == "__main__":
    test_train_cifar(int(os.environ.get("EPOCHS", "10")))
