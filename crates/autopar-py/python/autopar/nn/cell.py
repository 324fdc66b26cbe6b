"""``Cell``: MindSpore's network building block. Its attributes name its parameters
(``fc1.weight``), sub-cells and primitives; ``construct`` is compiled by tracing."""

from collections import OrderedDict

from .. import _trace
from ..common.parameter import Parameter, ParameterTuple
from ..ops import Primitive
from ..parallel.layout import Layout

__all__ = ["Cell", "SequentialCell", "CellList"]

_DEFAULT_NAME = "Parameter"


class Cell:
    """MindSpore's ``nn.Cell(auto_prefix=True, flags=None)``."""

    def __init__(self, auto_prefix=True, flags=None):
        d = self.__dict__
        d["_params"] = OrderedDict()
        d["_cells"] = OrderedDict()
        d["_primitives"] = OrderedDict()
        d["_auto_prefix"] = auto_prefix
        d["_pipeline_stage"] = -1
        d["_recompute"] = False
        d["training"] = False
        d["_parameter_layout_dict"] = {}
        d["cls_name"] = type(self).__name__

    def _ready(self, name):
        if "_params" not in self.__dict__:
            raise AttributeError(
                f"For '{type(self).__name__}', set attribute {name!r} after calling super().__init__() in __init__."
            )

    def __setattr__(self, name, value):
        from ..common.tensor import Tensor

        tables = self.__dict__.get("_params")
        if tables is not None and value is None:
            # MindSpore drops a parameter or cell set to None.
            for table in ("_params", "_cells", "_primitives"):
                self.__dict__[table].pop(name, None)
        elif tables is not None and name in tables and isinstance(value, Tensor) and not isinstance(value, Parameter):
            # A tensor given to a parameter's attribute is its new value (MindSpore's set_data).
            tables[name].set_data(value)
            return
        if isinstance(value, Parameter):
            self._ready(name)
            if "." in name:
                raise KeyError(f"The parameter's attribute name {name!r} may not contain '.'.")
            if not value.name or value.name == _DEFAULT_NAME:
                value.name = name
            self._params[name] = value
        elif isinstance(value, Cell):
            self._ready(name)
            self._cells[name] = value
            if self._auto_prefix:
                value.update_parameters_name(name + ".")
        elif isinstance(value, Primitive):
            self._ready(name)
            self._primitives[name] = value
            value._attr = name
        elif isinstance(value, ParameterTuple) or (isinstance(value, (list, tuple)) and value and all(isinstance(p, Parameter) for p in value)):
            pass  # an optimizer's view of parameters it does not own
        object.__setattr__(self, name, value)

    def __delattr__(self, name):
        for table in ("_params", "_cells", "_primitives"):
            self.__dict__.get(table, {}).pop(name, None)
        object.__delattr__(self, name)

    def construct(self, *args, **kwargs):
        raise NotImplementedError(f"{type(self).__name__} must define construct().")

    def __call__(self, *args, **kwargs):
        tracer = _trace.active()
        if tracer is None:
            # Called on values: compiled for inference (once per input shapes) and run on the
            # parallel context's devices, as MindSpore's graph mode runs a called cell.
            from ..common.tensor import Tensor
            from ..train.model import run_network

            if kwargs:
                raise TypeError(f"{type(self).__name__}: autopar passes a called cell's inputs by position, but got {sorted(kwargs)}.")
            predictor, outs = run_network(self, args, amp=self.__dict__.get("_amp", (None, None)))
            return Tensor(outs[0]) if predictor.single else tuple(Tensor(o) for o in outs)
        if "_amp" in self.__dict__:
            tracer.amp = self.__dict__["_amp"]  # auto_mixed_precision: the job's precision policy
        if "_trace_name" not in self.__dict__:
            # A cell called at the top (by a forward function, not a parent's construct): its
            # children take their names from it, as under Model.
            _name_children(self)
        name = getattr(self, "_trace_name", "")
        with tracer.cell(name, self._pipeline_stage, self._recompute):
            for attr, prim in self._primitives.items():
                if prim._attr is None:
                    prim._attr = attr
            strategy = self.__dict__.get("_in_strategy")
            if strategy is not None:
                args = self._laid_out(args, strategy)
            return self.construct(*args, **kwargs)

    def _laid_out(self, args, strategy):
        """The inputs with ``shard``'s layouts: each passes an exact identity (a scale by 1)
        that carries the layout, from which the ops inside are planned."""
        from ..common.tensor import Tensor
        from ..ops import Mul

        if len(strategy) != len(args):
            raise ValueError(f"For '{type(self).__name__}.shard', 'in_strategy' has {len(strategy)} layouts for {len(args)} inputs.")
        out = []
        for i, (x, s) in enumerate(zip(args, strategy)):
            if s is not None and isinstance(x, Tensor):
                identity = Mul()
                identity._attr = f"shard_input{i}"
                x = identity.shard((s,) if isinstance(s, Layout) else (tuple(s),))(x, 1.0)
            out.append(x)
        return tuple(out)

    def shard(self, in_strategy, out_strategy=None, parameter_plan=None, device="Ascend", level=0):
        """MindSpore's ``Cell.shard``: the layout of each input (a tuple of splits, a
        ``Layout``, or None);
        the ops inside take their strategies from them (best with auto_parallel's
        sharding_propagation)."""
        if out_strategy is not None or parameter_plan is not None:
            raise NotImplementedError(f"For '{type(self).__name__}.shard', autopar takes 'in_strategy' only.")
        if not isinstance(in_strategy, tuple):
            raise TypeError(f"For '{type(self).__name__}.shard', 'in_strategy' must be a tuple, but got {type(in_strategy)}.")
        for s in in_strategy:
            if s is not None and not isinstance(s, Layout) and (not isinstance(s, tuple) or not all(isinstance(v, int) and v >= 1 for v in s)):
                raise ValueError(
                    f"For '{type(self).__name__}.shard', every layout must be a Layout, a tuple of positive ints or None, but got {s!r}."
                )
        self.__dict__["_in_strategy"] = in_strategy
        return self

    # Parameters and cells.
    def cells_and_names(self, cell_name=""):
        seen = set()

        def walk(prefix, cell):
            if id(cell) in seen:
                return
            seen.add(id(cell))
            yield prefix, cell
            for name, child in cell._cells.items():
                if child is not None:
                    yield from walk(f"{prefix}.{name}" if prefix else name, child)

        yield from walk(cell_name, self)

    def name_cells(self):
        return OrderedDict(self._cells)

    def cells(self):
        return list(self._cells.values())

    def parameters_and_names(self, name_prefix="", expand=True):
        cells = self.cells_and_names(name_prefix) if expand else [(name_prefix, self)]
        seen = set()
        for cell_name, cell in cells:
            for par_name, par in cell._params.items():
                if par is not None and id(par) not in seen:
                    seen.add(id(par))
                    yield (f"{cell_name}.{par_name}" if cell_name else par_name), par

    def update_parameters_name(self, prefix="", recurse=True):
        for name, param in self.parameters_and_names(expand=recurse):
            param.name = prefix + name

    def get_parameters(self, expand=True):
        for _, p in self.parameters_and_names(expand=expand):
            yield p

    def trainable_params(self, recurse=True):
        return [p for p in self.get_parameters(recurse) if p.requires_grad]

    def untrainable_params(self, recurse=True):
        return [p for p in self.get_parameters(recurse) if not p.requires_grad]

    def parameters_dict(self, recurse=True):
        return OrderedDict((p.name, p) for p in self.get_parameters(recurse))

    def insert_param_to_cell(self, param_name, param, check_name_contain_dot=True):
        setattr(self, param_name, param)

    def insert_child_to_cell(self, child_name, child_cell):
        setattr(self, child_name, child_cell)

    # Modes and marks.
    def set_train(self, mode=True):
        for _, cell in self.cells_and_names():
            cell.__dict__["training"] = bool(mode)
        return self

    @property
    def pipeline_stage(self):
        return self._pipeline_stage

    @pipeline_stage.setter
    def pipeline_stage(self, value):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"For '{type(self).__name__}', 'pipeline_stage' must be a non-negative int, but got {value!r}.")
        self.__dict__["_pipeline_stage"] = value

    def recompute(self, **kwargs):
        """Recompute this cell's ops in the backward pass instead of keeping their outputs."""
        self.__dict__["_recompute"] = True
        return self

    @property
    def parameter_layout_dict(self):
        """MindSpore's ``parameter_layout_dict`` after compiling (training or ``compile``):
        each parameter's 12 layout fields on rank 0."""
        return self._parameter_layout_dict

    def compile(self, *inputs):
        """Compiles the cell for these inputs (Tensors or arrays) and plans it under the parallel
        context, filling ``parameter_layout_dict``, without running it."""
        from ..train.model import _as_arrays, predictor_for

        predictor_for(self, _as_arrays(inputs))
        return self

    def to_float(self, dst_type):
        from ..common import dtype as mstype

        if dst_type != mstype.float32:
            raise NotImplementedError("autopar trains in float32 today; mixed precision is not supported yet.")
        return self

    def __repr__(self):
        return f"{type(self).__name__}<>"


def _name_children(cell):
    """Gives each sub-cell its trace name: its attribute, or '' under a cell without prefix."""
    for name, child in cell._cells.items():
        if child is not None:
            child.__dict__["_trace_name"] = name if cell._auto_prefix else ""
            _name_children(child)


class SequentialCell(Cell):
    """Cells run in order (named ``0``, ``1``, ... unless given an OrderedDict)."""

    def __init__(self, *args):
        super().__init__()
        cells = args[0] if len(args) == 1 and isinstance(args[0], (list, tuple, OrderedDict)) else args
        if isinstance(cells, OrderedDict):
            for name, c in cells.items():
                setattr(self, name, c)
        else:
            for i, c in enumerate(cells):
                setattr(self, str(i), c)

    def __getitem__(self, i):
        return list(self._cells.values())[i]

    def __len__(self):
        return len(self._cells)

    def append(self, cell):
        setattr(self, str(len(self._cells)), cell)

    def construct(self, x):
        for c in self._cells.values():
            x = c(x)
        return x


class CellList(Cell):
    """A list of cells (named ``0``, ``1``, ...), run by the construct that holds it."""

    def __init__(self, args=None, **kwargs):
        super().__init__()
        for c in args or []:
            self.append(c)

    def __getitem__(self, i):
        return list(self._cells.values())[i]

    def __len__(self):
        return len(self._cells)

    def __iter__(self):
        return iter(self._cells.values())

    def append(self, cell):
        setattr(self, str(len(self._cells)), cell)

    def extend(self, cells):
        for c in cells:
            self.append(c)
        return self
