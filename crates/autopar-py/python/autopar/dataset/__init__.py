"""MindSpore's ``dataset``: sources (``NumpySlicesDataset``, ``GeneratorDataset``), the pipeline
(``map``, ``batch``, ``shuffle``, ``repeat``) and sharding by ``num_shards`` / ``shard_id``
(shard ``k`` reads rows ``k, k + n, k + 2n, ...`` of the source's order, wrapping around to
give every shard the same count, as MindSpore's DistributedSampler does).

When ``Model.train`` runs a job of N simulated devices in this process, it reads the pipeline
once per rank, shard ``r`` for rank ``r``, and joins the ranks' batches into the job's global
batch: the same rows each rank's process would read under a launcher."""

import numpy as np

from ..common.tensor import Tensor

__all__ = ["Dataset", "NumpySlicesDataset", "GeneratorDataset", "Cifar10Dataset", "MnistDataset", "vision", "transforms", "config"]


class _Config:
    def __init__(self):
        self.seed = None

    def set_seed(self, seed):
        self.seed = int(seed)

    def get_seed(self):
        return self.seed


config = _Config()


def _rng(epoch, salt=0):
    from .. import _context

    base = config.seed if config.seed is not None else _context.get_seed()
    if base is None:
        base = 0
    return np.random.default_rng([base, epoch, salt])


class Dataset:
    """A node of a data pipeline."""

    def __init__(self, parent=None):
        self._parent = parent

    # The pipeline.
    def map(self, operations=None, input_columns=None, output_columns=None, num_parallel_workers=None, **kwargs):
        return _Map(self, operations, input_columns, output_columns)

    def batch(self, batch_size, drop_remainder=False, num_parallel_workers=None, **kwargs):
        if kwargs.get("per_batch_map") is not None:
            raise NotImplementedError("For 'batch', autopar has no per_batch_map yet.")
        return _Batch(self, batch_size, drop_remainder)

    def shuffle(self, buffer_size):
        if not isinstance(buffer_size, int) or buffer_size < 1:
            raise ValueError(f"For 'shuffle', 'buffer_size' must be a positive int, but got {buffer_size!r}.")
        return _Shuffle(self, buffer_size)

    def repeat(self, count=None):
        return _Repeat(self, count)

    def project(self, columns):
        return _Project(self, [columns] if isinstance(columns, str) else list(columns))

    def rename(self, input_columns, output_columns):
        return _Rename(self, input_columns, output_columns)

    # What it holds.
    def get_col_names(self):
        return self._parent.get_col_names()

    def get_dataset_size(self):
        return self._size(None)

    def get_batch_size(self):
        return self._parent.get_batch_size() if self._parent is not None else 1

    def _size(self, shard):
        return self._parent._size(shard)

    def _source(self):
        return self._parent._source() if self._parent is not None else self

    def _rows(self, shard, epoch):
        """Rows (tuples of numpy arrays) of shard ``shard`` (None: the source's own) in epoch ``epoch``."""
        return self._parent._rows(shard, epoch)

    # Iteration.
    def create_tuple_iterator(self, columns=None, num_epochs=-1, output_numpy=False, do_copy=True):
        names = self.get_col_names()
        for c in columns or []:
            if c not in names:
                raise ValueError(f"create_tuple_iterator: column {c!r} is not one of {names}.")
        keep = [names.index(c) for c in columns] if columns else list(range(len(names)))
        return _Iterator(self, lambda row: [row[i] if output_numpy else Tensor(row[i]) for i in keep])

    def create_dict_iterator(self, num_epochs=-1, output_numpy=False, do_copy=True):
        names = self.get_col_names()
        return _Iterator(self, lambda row: {n: (v if output_numpy else Tensor(v)) for n, v in zip(names, row)})

    def __iter__(self):
        return iter(self.create_tuple_iterator())

    def _shards(self):
        src = self._source()
        return src.num_shards

    def _short_batch(self, shard):
        """The rows of the last, shorter batch of an epoch (0 when every batch is whole)."""
        return self._parent._short_batch(shard) if self._parent is not None else 0


class _Iterator:
    """MindSpore's dataset iterator: each pass over it is the next epoch (reshuffled), so
    ``for epoch in ...: for row in it`` sees every epoch."""

    def __init__(self, dataset, convert):
        self._dataset, self._convert, self._epoch, self._rows, self._shards = dataset, convert, 0, None, None

    def __iter__(self):
        return self

    def __next__(self):
        if self._rows is None:
            # Every shard's rows beside this one's when the job reads them all: a tensor of a
            # dataset sharded over the job's devices carries the job's global batch (every
            # rank's rows joined in rank order), which the one process running all ranks trains
            # on (value_and_grad's functions, a TrainOneStepCell called on it; Model alike).
            self._shards = _job_shards(self._dataset)
            if self._shards:
                self._rows = zip(*[self._dataset._rows(r, self._epoch) for r in range(self._shards)])
            else:
                self._rows = self._dataset._rows(None, self._epoch)
        try:
            row = next(self._rows)
        except StopIteration:
            self._rows, self._epoch = None, self._epoch + 1
            raise
        if not self._shards:
            return self._convert(row)
        out = self._convert(row[self._dataset._source().shard_id])
        if _batched(self._dataset):
            whole = self._convert(join_shards(row))
            for t, w in zip(out.values() if isinstance(out, dict) else out, whole.values() if isinstance(whole, dict) else whole):
                if isinstance(t, Tensor):
                    t._global = (self._shards, w.asnumpy())
        return out


def join_shards(rows):
    """The job's global batch from every rank's batch (a row of columns each), in rank order."""
    return tuple(np.concatenate(col) for col in zip(*rows))


def _batched(dataset):
    """Whether ``dataset``'s rows are batches (a ``batch`` in its pipeline)."""
    while dataset is not None:
        if isinstance(dataset, _Batch):
            return True
        dataset = dataset._parent
    return False


def _job_shards(dataset):
    """The shards a job reads all of: the dataset's, when they are the parallel context's devices
    (more than one) without ``full_batch``; else None."""
    from .. import _context

    shards = dataset._shards()
    n = _context._device_num()
    if not shards or shards < 2 or shards != n or bool(_context._PARALLEL.get("full_batch", False)):
        return None
    return shards


class _Source(Dataset):
    def __init__(self, num_samples, shuffle, num_shards, shard_id, sampler):
        super().__init__()
        if sampler is not None:
            raise NotImplementedError("autopar's datasets take 'shuffle', 'num_shards' and 'shard_id', not a sampler.")
        if (num_shards is None) != (shard_id is None):
            raise ValueError("'num_shards' and 'shard_id' must be given together.")
        if num_shards is not None:
            if not isinstance(num_shards, int) or num_shards < 1:
                raise ValueError(f"'num_shards' must be a positive int, but got {num_shards!r}.")
            if not isinstance(shard_id, int) or not 0 <= shard_id < num_shards:
                raise ValueError(f"'shard_id' must be in [0, {num_shards}), but got {shard_id!r}.")
        self.num_shards, self.shard_id = num_shards, shard_id
        self.num_samples = num_samples
        self.shuffle_rows = True if shuffle is None else bool(shuffle)

    def _count(self):
        raise NotImplementedError

    def _row(self, i):
        raise NotImplementedError

    def _order(self, shard, epoch):
        n = self._count()
        order = _rng(epoch).permutation(n) if self.shuffle_rows else np.arange(n)
        if self.num_shards is not None:
            k = self.shard_id if shard is None else shard
            per = -(-n // self.num_shards)
            order = order[(np.arange(per) * self.num_shards + k) % n]
        if self.num_samples is not None:
            order = order[: self.num_samples]
        return order

    def _size(self, shard):
        return len(self._order(shard, 0))

    def _rows(self, shard, epoch):
        for i in self._order(shard, epoch):
            yield self._row(int(i))

    def _source(self):
        return self


def _columns(data, column_names):
    if isinstance(data, dict):
        names, cols = list(data.keys()), list(data.values())
    elif isinstance(data, tuple):
        cols = list(data)
        names = [f"column_{i}" for i in range(len(cols))]
    else:
        cols = [data]
        names = ["column_0"]
    if column_names is not None:
        given = [column_names] if isinstance(column_names, str) else list(column_names)
        if len(given) != len(cols):
            raise ValueError(f"'column_names' has {len(given)} names for {len(cols)} columns.")
        names = given
    arrays = []
    for n, c in zip(names, cols):
        a = np.asarray(c.asnumpy() if isinstance(c, Tensor) else c)
        if a.dtype == np.float64 and not isinstance(c, np.ndarray):
            a = a.astype(np.float32)
        arrays.append(a)
    lens = {len(a) for a in arrays}
    if len(lens) != 1:
        raise ValueError(f"The columns of a NumpySlicesDataset must have the same length, but got {sorted(lens)}.")
    return names, arrays


class NumpySlicesDataset(_Source):
    """Rows sliced along the first axis of numpy arrays (a dict of columns, a tuple, or one array)."""

    def __init__(self, data, column_names=None, num_samples=None, num_parallel_workers=1, shuffle=None, sampler=None,
                 num_shards=None, shard_id=None):
        super().__init__(num_samples, shuffle, num_shards, shard_id, sampler)
        self._names, self._arrays = _columns(data, column_names)

    def get_col_names(self):
        return list(self._names)

    def _count(self):
        return len(self._arrays[0])

    def _row(self, i):
        return tuple(a[i] for a in self._arrays)


class GeneratorDataset(_Source):
    """Rows from a Python source: random-accessible (``__getitem__`` and ``__len__``), or an
    iterable / a callable returning one."""

    def __init__(self, source, column_names=None, column_types=None, schema=None, num_samples=None, num_parallel_workers=1,
                 shuffle=None, sampler=None, num_shards=None, shard_id=None, python_multiprocessing=True, max_rowsize=None):
        self._random = hasattr(source, "__getitem__") and hasattr(source, "__len__")
        if not self._random and (shuffle or num_shards is not None):
            raise ValueError("GeneratorDataset: 'shuffle' and 'num_shards' need a random-accessible source (__getitem__ and __len__).")
        super().__init__(num_samples, shuffle if self._random else False, num_shards, shard_id, sampler)
        if column_names is None:
            raise ValueError("GeneratorDataset needs 'column_names'.")
        self._names = [column_names] if isinstance(column_names, str) else list(column_names)
        self._source_obj = source
        self._cache = None

    def get_col_names(self):
        return list(self._names)

    def _materialized(self):
        if self._cache is None:
            it = self._source_obj() if callable(self._source_obj) else self._source_obj
            self._cache = [self._as_row(r) for r in it]
        return self._cache

    def _as_row(self, r):
        r = r if isinstance(r, tuple) else (tuple(r) if isinstance(r, list) and len(self._names) > 1 else (r,))
        if len(r) != len(self._names):
            raise ValueError(f"GeneratorDataset: a row has {len(r)} values for the columns {self._names}.")
        return tuple(np.asarray(v.asnumpy() if isinstance(v, Tensor) else v) for v in r)

    def _count(self):
        return len(self._source_obj) if self._random else len(self._materialized())

    def _row(self, i):
        return self._as_row(self._source_obj[i]) if self._random else self._materialized()[i]


def _usage(cls, usage, allowed):
    usage = usage or "all"
    if usage not in allowed:
        raise ValueError(f"For '{cls}', 'usage' must be one of {allowed}, but got {usage!r}.")
    return usage


def _read(path, cls):
    import os

    if not os.path.isfile(path):
        raise ValueError(f"For '{cls}', the file {path} does not exist: give the folder that holds the data set's files.")
    with open(path, "rb") as f:
        return f.read()


class Cifar10Dataset(_Source):
    """CIFAR-10's binary version (``cifar-10-batches-bin``): columns ``image`` (uint8 HWC
    32x32x3) and ``label`` (uint32), the files' records in order (``data_batch_1..5.bin`` for
    ``usage="train"``, ``test_batch.bin`` for ``"test"``, both for ``"all"``)."""

    RECORD = 1 + 32 * 32 * 3

    def __init__(self, dataset_dir, usage=None, num_samples=None, num_parallel_workers=None, shuffle=None, sampler=None,
                 num_shards=None, shard_id=None, cache=None):
        super().__init__(num_samples, shuffle, num_shards, shard_id, sampler)
        import os

        usage = _usage("Cifar10Dataset", usage, ("train", "test", "all"))
        names = ([f"data_batch_{i}.bin" for i in range(1, 6)] if usage in ("train", "all") else []) + (["test_batch.bin"] if usage in ("test", "all") else [])
        chunks = []
        for name in names:
            data = _read(os.path.join(dataset_dir, name), "Cifar10Dataset")
            if len(data) % self.RECORD:
                raise ValueError(f"For 'Cifar10Dataset', {os.path.join(dataset_dir, name)} holds {len(data)} bytes, not whole records of {self.RECORD}.")
            chunks.append(np.frombuffer(data, dtype=np.uint8).reshape(-1, self.RECORD))
        records = np.concatenate(chunks)
        self._labels = records[:, 0].astype(np.uint32)
        self._images = records[:, 1:].reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)

    def get_col_names(self):
        return ["image", "label"]

    def _count(self):
        return len(self._labels)

    def _row(self, i):
        return (np.ascontiguousarray(self._images[i]), self._labels[i])


class MnistDataset(_Source):
    """MNIST's idx files: columns ``image`` (uint8 28x28x1) and ``label`` (uint32); with
    ``usage="all"`` the test files' records first, as MindSpore reads them."""

    def __init__(self, dataset_dir, usage=None, num_samples=None, num_parallel_workers=None, shuffle=None, sampler=None,
                 num_shards=None, shard_id=None, cache=None):
        super().__init__(num_samples, shuffle, num_shards, shard_id, sampler)
        import os

        usage = _usage("MnistDataset", usage, ("train", "test", "all"))
        images, labels = [], []
        # MindSpore reads the files in name order: t10k's before train's.
        for prefix in (["t10k"] if usage in ("test", "all") else []) + (["train"] if usage in ("train", "all") else []):
            img = _read(os.path.join(dataset_dir, f"{prefix}-images-idx3-ubyte"), "MnistDataset")
            lab = _read(os.path.join(dataset_dir, f"{prefix}-labels-idx1-ubyte"), "MnistDataset")
            n, rows, cols = (int.from_bytes(img[k:k + 4], "big") for k in (4, 8, 12))
            if int.from_bytes(img[:4], "big") != 2051 or len(img) != 16 + n * rows * cols:
                raise ValueError(f"For 'MnistDataset', {prefix}-images-idx3-ubyte is not an idx3 image file of {n} images.")
            if int.from_bytes(lab[:4], "big") != 2049 or len(lab) != 8 + n:
                raise ValueError(f"For 'MnistDataset', {prefix}-labels-idx1-ubyte does not hold the {n} labels of its images.")
            images.append(np.frombuffer(img, dtype=np.uint8, offset=16).reshape(n, rows, cols, 1))
            labels.append(np.frombuffer(lab, dtype=np.uint8, offset=8).astype(np.uint32))
        self._images, self._labels = np.concatenate(images), np.concatenate(labels)

    def get_col_names(self):
        return ["image", "label"]

    def _count(self):
        return len(self._labels)

    def _row(self, i):
        return (self._images[i], self._labels[i])


class _Map(Dataset):
    def __init__(self, parent, operations, input_columns, output_columns):
        super().__init__(parent)
        self._ops = operations if isinstance(operations, (list, tuple)) else [operations]
        names = parent.get_col_names()
        cols = input_columns if input_columns is not None else names[:1]
        self._in = [cols] if isinstance(cols, str) else list(cols)
        for c in self._in:
            if c not in names:
                raise ValueError(f"map: input column {c!r} is not one of {names}.")
        out = output_columns if output_columns is not None else self._in
        self._out = [out] if isinstance(out, str) else list(out)

    def get_col_names(self):
        names = self._parent.get_col_names()
        if self._out == self._in:
            return names
        first = names.index(self._in[0])
        rest = [n for n in names if n not in self._in]
        return rest[:first] + self._out + rest[first:]

    def _rows(self, shard, epoch):
        names = self._parent.get_col_names()
        idx = [names.index(c) for c in self._in]
        out_names = self.get_col_names()
        for k, row in enumerate(self._parent._rows(shard, epoch)):
            values = tuple(row[i] for i in idx)
            for op in self._ops:
                if hasattr(op, "_bind_rng"):
                    op._bind_rng(_rng(epoch, 1 + k + 1000003 * (shard or 0)))
                got = op(*values)
                values = got if isinstance(got, tuple) else (got,)
            values = tuple(np.asarray(v.asnumpy() if isinstance(v, Tensor) else v) for v in values)
            if self._out == self._in:
                row = list(row)
                for i, v in zip(idx, values):
                    row[i] = v
                yield tuple(row)
            else:
                kept = {n: row[i] for i, n in enumerate(names) if n not in self._in}
                kept.update(zip(self._out, values))
                yield tuple(kept[n] for n in out_names)


class _Batch(Dataset):
    def __init__(self, parent, batch_size, drop_remainder):
        super().__init__(parent)
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"For 'batch', 'batch_size' must be a positive int, but got {batch_size!r}.")
        self.batch_size, self.drop_remainder = batch_size, bool(drop_remainder)

    def get_batch_size(self):
        return self.batch_size

    def _short_batch(self, shard):
        return 0 if self.drop_remainder else self._parent._size(shard) % self.batch_size

    def _size(self, shard):
        n = self._parent._size(shard)
        return n // self.batch_size if self.drop_remainder else -(-n // self.batch_size)

    def _rows(self, shard, epoch):
        buf = []
        for row in self._parent._rows(shard, epoch):
            buf.append(row)
            if len(buf) == self.batch_size:
                yield tuple(np.stack(c) for c in zip(*buf))
                buf = []
        if buf and not self.drop_remainder:
            yield tuple(np.stack(c) for c in zip(*buf))


class _Shuffle(Dataset):
    def __init__(self, parent, buffer_size):
        super().__init__(parent)
        self.buffer_size = buffer_size

    def _rows(self, shard, epoch):
        rng = _rng(epoch, 7)
        buf = []
        for row in self._parent._rows(shard, epoch):
            buf.append(row)
            if len(buf) >= self.buffer_size:
                yield buf.pop(int(rng.integers(len(buf))))
        while buf:
            yield buf.pop(int(rng.integers(len(buf))))


class _Repeat(Dataset):
    def __init__(self, parent, count):
        super().__init__(parent)
        if count is None or count == -1:
            raise NotImplementedError("autopar repeats a dataset a given number of times (repeat(count) with count >= 1).")
        self.count = int(count)

    def _size(self, shard):
        return self._parent._size(shard) * self.count

    def _rows(self, shard, epoch):
        for k in range(self.count):
            yield from self._parent._rows(shard, epoch * self.count + k)


class _Project(Dataset):
    def __init__(self, parent, columns):
        super().__init__(parent)
        self._cols = columns

    def get_col_names(self):
        return list(self._cols)

    def _rows(self, shard, epoch):
        names = self._parent.get_col_names()
        idx = [names.index(c) for c in self._cols]
        for row in self._parent._rows(shard, epoch):
            yield tuple(row[i] for i in idx)


class _Rename(Dataset):
    def __init__(self, parent, input_columns, output_columns):
        super().__init__(parent)
        ins = [input_columns] if isinstance(input_columns, str) else list(input_columns)
        outs = [output_columns] if isinstance(output_columns, str) else list(output_columns)
        self._map = dict(zip(ins, outs))

    def get_col_names(self):
        return [self._map.get(n, n) for n in self._parent.get_col_names()]


def _epoch_rows(dataset, shard, epoch):
    return dataset._rows(shard, epoch)


from . import transforms, vision  # noqa: E402
