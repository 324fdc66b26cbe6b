"""ResNet-50 for the ResNet tutorial, written with MindSpore's API (`import autopar` for
`import mindspore`): `resnet50(batch_size, num_classes)`, bottleneck blocks of 1x1, 3x3 and 1x1
convolutions with BatchNorm, a projection shortcut where the shape changes."""
import numpy as np

import autopar.nn as nn
import autopar.ops as ops
from autopar import Tensor


def _weight(shape):
    fan_in = int(np.prod(shape[1:]))
    return Tensor((np.random.default_rng(len(shape) * 7919 + sum(shape)).standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(np.float32))


def _conv(cin, cout, k, stride=1):
    pad_mode = "same" if k > 1 else "valid"
    return nn.Conv2d(cin, cout, k, stride=stride, pad_mode=pad_mode, weight_init=_weight([cout, cin, k, k]))


def _bn(channels, last=False):
    return nn.BatchNorm2d(channels, momentum=0.9, gamma_init="zeros" if last else "ones")


class ResidualBlock(nn.Cell):
    expansion = 4

    def __init__(self, in_channels, out_channels, stride=1):
        super().__init__()
        mid = out_channels // self.expansion
        self.conv1 = _conv(in_channels, mid, 1)
        self.bn1 = _bn(mid)
        self.conv2 = _conv(mid, mid, 3, stride)
        self.bn2 = _bn(mid)
        self.conv3 = _conv(mid, out_channels, 1)
        self.bn3 = _bn(out_channels, last=True)
        self.relu = nn.ReLU()
        self.down_sample = stride != 1 or in_channels != out_channels
        if self.down_sample:
            self.conv_down = _conv(in_channels, out_channels, 1, stride)
            self.bn_down = _bn(out_channels)
        self.add = ops.Add()

    def construct(self, x):
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        if self.down_sample:
            identity = self.bn_down(self.conv_down(identity))
        return self.relu(self.add(out, identity))


class ResNet(nn.Cell):
    def __init__(self, layer_nums, num_classes=10, batch_size=32):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, stride=2, pad_mode="same", weight_init=_weight([64, 3, 7, 7]))
        self.bn1 = _bn(64)
        self.relu = nn.ReLU()
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, pad_mode="same")
        channels = [64, 256, 512, 1024, 2048]
        layers = []
        for i, n in enumerate(layer_nums):
            blocks = [ResidualBlock(channels[i], channels[i + 1], stride=1 if i == 0 else 2)]
            blocks += [ResidualBlock(channels[i + 1], channels[i + 1]) for _ in range(n - 1)]
            layers.append(nn.SequentialCell(blocks))
        self.layer1, self.layer2, self.layer3, self.layer4 = layers
        self.mean = ops.ReduceMean(keep_dims=False)
        self.fc = nn.Dense(2048, num_classes, weight_init=_weight([num_classes, 2048]), bias_init="zeros")

    def construct(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(self.mean(x, (2, 3)))


def resnet50(batch_size, num_classes):
    return ResNet([3, 4, 6, 3], num_classes, batch_size)
