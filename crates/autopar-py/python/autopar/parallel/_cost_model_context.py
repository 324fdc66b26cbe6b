"""``mindspore.parallel._cost_model_context``: the strategy search's cost-model parameters
(``from mindspore.parallel import _cost_model_context as cost_model_context``)."""

from .._context import get_cost_model_context, reset_cost_model_context, set_cost_model_context

__all__ = ["get_cost_model_context", "reset_cost_model_context", "set_cost_model_context"]
