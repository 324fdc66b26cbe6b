"""The cells that make a network trainable: ``WithLossCell`` (network and loss) and
``TrainOneStepCell`` (with its optimizer), as MindSpore's ``Model`` builds them."""

from .cell import Cell

__all__ = [
    "WithLossCell", "TrainOneStepCell", "TrainOneStepWithLossScaleCell", "WithEvalCell", "PipelineCell", "GradAccumulationCell",
    "MicroBatchInterleaved",
]


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

    def __call__(self, *inputs):
        from .. import _trace

        if _trace.active() is not None:
            return super().__call__(*inputs)
        # Called on values: one training step, as MindSpore's TrainOneStepCell takes one.
        from ..train.model import train_step

        return train_step(self, inputs)


class TrainOneStepWithLossScaleCell(Cell):
    """MindSpore's loss-scaled training cell: not run by autopar's front end yet."""

    def __init__(self, network, optimizer, scale_sense):
        raise NotImplementedError(
            "autopar does not run TrainOneStepWithLossScaleCell called on tensors yet: give the loss-scale manager to "
            "Model(network, loss_fn, optimizer, loss_scale_manager=FixedLossScaleManager(...) or DynamicLossScaleManager(...))."
        )


class WithEvalCell(Cell):
    def __init__(self, network, loss_fn, add_cast_fp32=False):
        super().__init__(auto_prefix=False)
        self._network = network
        self._loss_fn = loss_fn

    def construct(self, data, label):
        outputs = self._network(data)
        return self._loss_fn(outputs, label), outputs, label


class _MicroBatches(Cell):
    """A loss network whose global batch is cut into ``micro_size`` micro-batches each step."""

    def __init__(self, network, micro_size):
        super().__init__(auto_prefix=False)
        if not isinstance(micro_size, int) or isinstance(micro_size, bool) or micro_size < 1:
            raise ValueError(f"For '{type(self).__name__}', 'micro_size' must be a positive int, but got {micro_size!r}.")
        self.network = network
        self.micro_size = micro_size

    def construct(self, *inputs):
        return self.network(*inputs)


class PipelineCell(_MicroBatches):
    """MindSpore's ``nn.PipelineCell(network, micro_size)``: the micro-batches that flow through
    the pipeline stages (``cell.pipeline_stage``) each step, in the context's scheduler's order."""


class GradAccumulationCell(_MicroBatches):
    """MindSpore's ``nn.GradAccumulationCell(network, micro_size)``: gradients of ``micro_size``
    micro-batches accumulated into one update."""


class MicroBatchInterleaved(Cell):
    def __init__(self, network, interleave_num=2):
        super().__init__(auto_prefix=False)
        raise NotImplementedError("autopar does not interleave micro-batches within a stage (MicroBatchInterleaved).")


class DistributedGradReducer(Cell):
    """MindSpore's ``nn.DistributedGradReducer(parameters, mean=None, degree=None)``: in
    data_parallel, the gradients summed over the ranks, divided by ``degree`` (the ranks, by
    default) when ``mean`` (by default the context's ``gradients_mean``). autopar's ranks have
    synchronised the gradients of ``value_and_grad``'s function already, summed or averaged as
    the job's ``gradients_mean`` says (averaged in data_parallel unless set): the reducer passes
    them through, or rescales them to its own sum or mean."""

    def __init__(self, parameters, mean=None, degree=None, fusion_type=1, group=None):
        super().__init__(auto_prefix=False)
        from .. import _context

        if degree is not None and (not isinstance(degree, int) or isinstance(degree, bool) or degree < 1):
            raise ValueError(f"For 'DistributedGradReducer', 'degree' must be a positive int, but got {degree!r}.")
        mode = str(_context._PARALLEL.get("parallel_mode", "stand_alone"))
        given = _context._PARALLEL.get("gradients_mean")
        job_mean = bool(given) if given is not None else mode == "data_parallel"
        mean = bool(given) if mean is None else bool(mean)
        n = _context._device_num()
        # MindSpore's: the sum over the ranks, divided by degree under mean; the job's: the sum,
        # divided by the ranks under its mean.
        self._factor = 1.0
        if mode == "data_parallel" and n > 1:
            self._factor = (1.0 / (degree or n) if mean else 1.0) * (float(n) if job_mean else 1.0)

    def construct(self, grads):
        return grads

    def __call__(self, grads):
        if self._factor == 1.0:
            return grads
        return tuple(g * self._factor for g in grads)
