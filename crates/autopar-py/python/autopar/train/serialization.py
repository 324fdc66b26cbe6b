"""``save_checkpoint`` / ``load_checkpoint`` / ``load_param_into_net`` over networks and
parameter dicts (MindSpore's ``mindspore.train.serialization``)."""

import numpy as np

from .. import checkpoint as _ckpt
from ..common.parameter import Parameter
from ..common.tensor import Tensor

__all__ = ["save_checkpoint", "load_checkpoint", "load_param_into_net"]


def _value(v):
    return v.asnumpy() if isinstance(v, Tensor) else v


def save_checkpoint(save_obj, ckpt_file_name, integrated_save=True, async_save=False, append_dict=None, enc_key=None,
                    enc_mode="AES-GCM", choice_func=None, crc_check=False, format="ckpt", **kwargs):
    """MindSpore's ``save_checkpoint``: ``save_obj`` a Cell (its parameters, whole), a dict or a list."""
    from ..nn.cell import Cell

    if isinstance(save_obj, Cell):
        save_obj = {p.name: p.asnumpy() for p in save_obj.get_parameters()}
    elif isinstance(save_obj, dict):
        save_obj = {k: _value(v) for k, v in save_obj.items()}
    elif isinstance(save_obj, list):
        save_obj = [
            {"name": e["name"], "data": _value(e["data"])} if isinstance(e, dict) else e if not isinstance(e, Parameter) else (e.name, e.asnumpy())
            for e in save_obj
        ]
    return _ckpt.save_checkpoint(save_obj, ckpt_file_name, integrated_save, async_save, append_dict, enc_key, enc_mode, choice_func,
                                 crc_check, format, **kwargs)


def load_checkpoint(ckpt_file_name, net=None, strict_load=False, filter_prefix=None, dec_key=None, dec_mode="AES-GCM",
                    specify_prefix=None, choice_func=None, crc_check=False, remove_redundancy=False, format="ckpt"):
    """MindSpore's ``load_checkpoint``: ``{name: Parameter}``, loaded into ``net`` when given."""
    raw = _ckpt.load_checkpoint(ckpt_file_name, None, strict_load, filter_prefix, dec_key, dec_mode, specify_prefix, choice_func,
                                crc_check, remove_redundancy, format)
    params = {k: (Parameter(v, name=k) if isinstance(v, np.ndarray) else v) for k, v in raw.items()}
    if net is not None:
        load_param_into_net(net, params, strict_load)
    return params


def load_param_into_net(net, parameter_dict, strict_load=False, remove_redundancy=False):
    """Sets every parameter of ``net`` named in ``parameter_dict`` (of an optimizer: its state,
    resumed on the ranks of the job it next updates); returns (the network's parameters not
    loaded, the dict's entries not used)."""
    from ..nn.cell import Cell
    from ..nn.optim import Optimizer

    if not isinstance(parameter_dict, dict):
        raise TypeError(f"For 'load_param_into_net', 'parameter_dict' must be a dict, but got {type(parameter_dict)}.")
    if isinstance(net, Optimizer):
        # The optimizer's state (MindSpore's names) and global_step: given to the ranks of the
        # job it next updates, which resumes it there.
        missing, used = net._load_state(parameter_dict)
        if strict_load and missing:
            raise RuntimeError(f"For 'load_param_into_net', these optimizer states were not loaded: {missing}.")
        return missing, [k for k in parameter_dict if k not in used]
    if not isinstance(net, Cell):
        raise TypeError(f"For 'load_param_into_net', 'net' must be a Cell or an optimizer, but got {type(net)}.")
    not_loaded = []
    used = set()
    for name, p in net.parameters_dict().items():
        if name in parameter_dict:
            value = np.asarray(_value(parameter_dict[name]))
            if tuple(value.shape) != tuple(p.shape):
                raise RuntimeError(
                    f"For 'load_param_into_net', {name} in the network has shape {tuple(p.shape)}, but the loaded value {tuple(value.shape)}."
                )
            p.set_data(value)
            used.add(name)
        else:
            not_loaded.append(name)
    if strict_load and not_loaded:
        raise RuntimeError(f"For 'load_param_into_net', these parameters were not loaded: {not_loaded}.")
    return not_loaded, [k for k in parameter_dict if k not in used]
