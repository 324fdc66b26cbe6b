"""``mindspore.parallel.Layout``: a device matrix whose axes have names, called with the names
splitting each dimension of a tensor (``layout("dp", ("sp", "mp"), "None")``) to give an op's
input its layout in ``shard(in_strategy=(layout(...), ...))``."""

import copy

INTERLEAVED = "interleaved_parallel"


class Layout:
    """MindSpore's ``Layout(device_matrix, alias_name, rank_list=None)``.

    Several names in a tuple split one dimension (the first the most significant), ``"None"``
    leaves it whole, and an axis no dimension names holds replicas. ``"interleaved_parallel"``,
    the last name when present, is MindSpore's virtual split computed in turn on one device:
    autopar computes the chunks together (the same numbers).
    """

    def __init__(self, device_matrix, alias_name, rank_list=None):
        if not isinstance(device_matrix, tuple):
            raise TypeError(f"device_matrix must be tuple type, but got:{type(device_matrix)}")
        if not isinstance(alias_name, tuple):
            raise TypeError(f"alias_name must be tuple type, but got:{type(alias_name)}")
        if len(device_matrix) != len(alias_name):
            raise ValueError("device_matrix length should be equal to alias_name length")
        for d in device_matrix:
            if not isinstance(d, int) or isinstance(d, bool):
                raise TypeError(f"The element of device_matrix must be int type, but got:{type(d)}")
            if d < 1:
                raise ValueError(f"The element of device_matrix must be positive, but got {d}.")
        for a in alias_name:
            if not isinstance(a, str):
                raise TypeError(f"The element of alias_name must be str type, but got:{type(a)}")
            if not a:
                raise ValueError("The element of alias_name can not be empty.")
            if a == "None":
                raise ValueError("The element of alias_name can not set 'None', because 'None' means no sharding.")
        if len(set(alias_name)) != len(alias_name):
            raise ValueError(f"Each element of alias_name {alias_name} should be different")
        if INTERLEAVED in alias_name and alias_name.index(INTERLEAVED) != len(alias_name) - 1:
            raise ValueError(
                f"When alias_name {alias_name} contains keyword 'interleaved_parallel', it should be at the last dim of "
                "alias_name, which means the virtual sharding."
            )
        size = 1
        for d in device_matrix:
            size *= d
        if rank_list is not None:
            if not isinstance(rank_list, list) or not all(isinstance(r, int) for r in rank_list):
                raise TypeError(f"The rank_list should be a list of int, but got {rank_list!r}.")
            if len(rank_list) != size:
                raise ValueError(
                    "The length of rank_list should be equal to the product of device_matrix, "
                    f"but got {len(rank_list)} and {size}."
                )
            if rank_list != list(range(size)):
                raise NotImplementedError(
                    f"autopar places a Layout's devices in rank order; rank_list {rank_list} is not supported: "
                    "leave it out (ranks 0..N in order)."
                )
        self._device_shape = device_matrix
        self._alias_name = alias_name
        self._rank_list = list(range(size))
        self._names = None

    def __call__(self, *tensor_map):
        names = []
        written = []
        for entry in tensor_map:
            group = entry if isinstance(entry, tuple) else (entry,)
            dim = []
            for item in group:
                if item == "None":
                    continue
                if item not in self._alias_name:
                    raise ValueError(f"The axis {item} is not found in {self._alias_name}")
                if item in written:
                    raise ValueError(f"The axis {item} has been set more than one in {self._alias_name}")
                written.append(item)
                dim.append(item)
            names.append(tuple(dim))
        out = copy.deepcopy(self)
        out._names = tuple(names)
        return out

    def _tensor_map(self):
        n = len(self._alias_name)
        m = []
        for dim in self._names:
            idx = tuple(n - 1 - self._alias_name.index(a) for a in dim)
            m.append(-1 if not idx else (idx[0] if len(idx) == 1 else idx))
        return tuple(m)

    def to_dict(self):
        """MindSpore's dictionary: device_matrix, tensor_map (axes counted from the right, -1
        not split), interleaved_parallel, alias_name, rank_list."""
        if self._names is None:
            raise ValueError("The tensor_map of layout is None")
        return {
            "device_matrix": self._device_shape,
            "tensor_map": self._tensor_map(),
            "interleaved_parallel": INTERLEAVED in self._alias_name,
            "alias_name": self._alias_name,
            "rank_list": list(self._rank_list),
        }

    def _same_mesh(self, other):
        return self._device_shape == other._device_shape and self._alias_name == other._alias_name

    def __repr__(self):
        return f"Layout({self._device_shape!r}, {self._alias_name!r})" + ("" if self._names is None else repr(self._names))


def _quoted(names):
    items = [f'"{n}"' for n in names]
    return "(" + items[0] + ",)" if len(items) == 1 else "(" + ", ".join(items) + ")"


def layouts_text(layouts, what):
    """The text autopar's planner reads for an op's input layouts (one device matrix for all)."""
    first = layouts[0]
    for lay in layouts:
        if lay._names is None:
            raise ValueError(f"For '{what}', a Layout must be called with the axis names of each dimension, e.g. layout('dp', 'None').")
        if not lay._same_mesh(first):
            raise ValueError(
                f"For '{what}', every input's Layout must come from one device matrix, but got {first!r} and {lay!r}."
            )
    inputs = []
    for lay in layouts:
        dims = []
        for dim in lay._names:
            dims.append('"None"' if not dim else (f'"{dim[0]}"' if len(dim) == 1 else _quoted(dim)))
        inputs.append("(" + dims[0] + ",)" if len(dims) == 1 else "(" + ", ".join(dims) + ")")
    dev = "(" + ", ".join(str(d) for d in first._device_shape) + ("," if len(first._device_shape) == 1 else "") + ")"
    body = "(" + inputs[0] + ",)" if len(inputs) == 1 else "(" + ", ".join(inputs) + ")"
    return f"Layout({dev}, {_quoted(first._alias_name)}){body}"
