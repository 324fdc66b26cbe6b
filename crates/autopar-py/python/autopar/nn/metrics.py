"""MindSpore's metrics for ``Model.eval``: ``Accuracy``, ``Loss``, ``Top1CategoricalAccuracy``,
``Top5CategoricalAccuracy``, by object or by MindSpore's names (``{"acc", "loss"}``)."""

import numpy as np

__all__ = ["Metric", "Accuracy", "Loss", "Top1CategoricalAccuracy", "Top5CategoricalAccuracy", "TopKCategoricalAccuracy"]


class Metric:
    def clear(self):
        raise NotImplementedError

    def update(self, *inputs):
        raise NotImplementedError

    def eval(self):
        raise NotImplementedError

    def _feed(self, logits, labels, loss):
        self.update(logits, labels)


def _labels(labels, logits):
    labels = np.asarray(labels)
    return labels.argmax(axis=-1) if labels.ndim == logits.ndim else labels.reshape(-1)


class TopKCategoricalAccuracy(Metric):
    """The share of samples whose label is among the ``k`` largest outputs."""

    def __init__(self, k):
        self.k = k
        self.clear()

    def clear(self):
        self._correct, self._total = 0, 0

    def update(self, y_pred, y):
        y_pred = np.asarray(y_pred)
        y_pred = y_pred.reshape(-1, y_pred.shape[-1])
        labels = _labels(y, y_pred)
        if self.k == 1:
            got = y_pred.argmax(axis=-1) == labels
        else:
            got = (np.argsort(-y_pred, axis=-1, kind="stable")[:, : self.k] == labels[:, None]).any(axis=1)
        self._correct += int(got.sum())
        self._total += got.size

    def eval(self):
        if self._total == 0:
            raise RuntimeError(f"{type(self).__name__} can not be calculated, because the number of samples is 0.")
        return self._correct / self._total


class Accuracy(TopKCategoricalAccuracy):
    def __init__(self, eval_type="classification"):
        if eval_type != "classification":
            raise NotImplementedError(f"autopar's Accuracy is for classification, but got eval_type={eval_type!r}.")
        super().__init__(1)


class Top1CategoricalAccuracy(TopKCategoricalAccuracy):
    def __init__(self):
        super().__init__(1)


class Top5CategoricalAccuracy(TopKCategoricalAccuracy):
    def __init__(self):
        super().__init__(5)


class Loss(Metric):
    def __init__(self):
        self.clear()

    def clear(self):
        self._sum, self._count = 0.0, 0

    def update(self, *inputs):
        loss = np.asarray(inputs[0])
        self._sum += float(loss.mean()) if loss.ndim else float(loss)
        self._count += 1

    def _feed(self, logits, labels, loss):
        if loss is None:
            raise ValueError("The 'loss' metric needs the Model's loss_fn.")
        self.update(loss)

    def eval(self):
        if self._count == 0:
            raise RuntimeError("The average loss can not be calculated, because the number of samples is 0.")
        return self._sum / self._count


_NAMES = {"acc": Accuracy, "accuracy": Accuracy, "loss": Loss, "top_1_accuracy": Top1CategoricalAccuracy,
          "top_5_accuracy": Top5CategoricalAccuracy}


def _metrics(spec):
    if isinstance(spec, dict):
        return dict(spec)
    if isinstance(spec, (set, list, tuple)):
        out = {}
        for name in spec:
            cls = _NAMES.get(str(name).lower())
            if cls is None:
                raise ValueError(f"Unknown metric {name!r}; use one of {sorted(_NAMES)} or a Metric object.")
            out[name] = cls()
        return out
    raise TypeError(f"'metrics' must be a set of names or a dict of Metrics, but got {type(spec)}.")
