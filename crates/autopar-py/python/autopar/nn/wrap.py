"""The cells that make a network trainable: ``WithLossCell`` (network and loss) and
``TrainOneStepCell`` (with its optimizer), as MindSpore's ``Model`` builds them."""

from .cell import Cell

__all__ = ["WithLossCell", "TrainOneStepCell", "WithEvalCell"]


class WithLossCell(Cell):
    def __init__(self, backbone, loss_fn):
        super().__init__(auto_prefix=False)
        self._backbone = backbone
        self._loss_fn = loss_fn

    def construct(self, data, label):
        return self._loss_fn(self._backbone(data), label)

    @property
    def backbone_network(self):
        return self._backbone


class TrainOneStepCell(Cell):
    """A loss network with its optimizer: ``Model`` trains it one step per batch."""

    def __init__(self, network, optimizer, sens=None, return_grad=False):
        super().__init__(auto_prefix=False)
        if sens not in (None, 1.0):
            raise NotImplementedError("For 'TrainOneStepCell', autopar scales no loss (sens must be None or 1.0).")
        self.network = network
        self.optimizer = optimizer

    def construct(self, *inputs):
        return self.network(*inputs)


class WithEvalCell(Cell):
    def __init__(self, network, loss_fn, add_cast_fp32=False):
        super().__init__(auto_prefix=False)
        self._network = network
        self._loss_fn = loss_fn

    def construct(self, data, label):
        outputs = self._network(data)
        return self._loss_fn(outputs, label), outputs, label
