"""MindSpore's training callbacks: ``Callback`` (``step_end(run_context)``, ``cb_params``),
``LossMonitor``, ``TimeMonitor`` and ``ModelCheckpoint`` with ``CheckpointConfig``."""

import os
import time

import numpy as np

__all__ = ["Callback", "RunContext", "LossMonitor", "TimeMonitor", "ModelCheckpoint", "CheckpointConfig"]


class _Params(dict):
    """``cb_params``: what a callback sees of the run, by attribute or key (MindSpore's is a dict)."""

    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(f"cb_params has no {name!r}; it has {sorted(self)}") from None

    def __setattr__(self, name, value):
        self[name] = value


class RunContext:
    def __init__(self, original_args):
        self._original_args = original_args
        self._stop_requested = False

    def original_args(self):
        return self._original_args

    def request_stop(self):
        self._stop_requested = True

    def get_stop_requested(self):
        return self._stop_requested


class Callback:
    """Override any of ``begin``, ``epoch_begin``, ``step_begin``, ``step_end``, ``epoch_end``,
    ``end`` (or MindSpore 2's ``on_train_*`` forms)."""

    def begin(self, run_context):
        pass

    def epoch_begin(self, run_context):
        pass

    def step_begin(self, run_context):
        pass

    def step_end(self, run_context):
        pass

    def epoch_end(self, run_context):
        pass

    def end(self, run_context):
        pass

    def on_train_begin(self, run_context):
        self.begin(run_context)

    def on_train_epoch_begin(self, run_context):
        self.epoch_begin(run_context)

    def on_train_step_begin(self, run_context):
        self.step_begin(run_context)

    def on_train_step_end(self, run_context):
        self.step_end(run_context)

    def on_train_epoch_end(self, run_context):
        self.epoch_end(run_context)

    def on_train_end(self, run_context):
        self.end(run_context)


class LossMonitor(Callback):
    """Prints ``epoch: E step: S, loss is L`` every ``per_print_times`` steps."""

    def __init__(self, per_print_times=1):
        if not isinstance(per_print_times, int) or per_print_times < 0:
            raise ValueError(f"For 'LossMonitor', 'per_print_times' must be a non-negative int, but got {per_print_times!r}.")
        self._per_print_times = per_print_times
        self._last_print_time = 0

    def step_end(self, run_context):
        cb = run_context.original_args()
        outputs = cb.net_outputs
        if isinstance(outputs, (tuple, list)):
            outputs = outputs[0]  # (loss, overflow, scale) with a loss-scale manager
        loss = float(np.mean(np.asarray(outputs)))
        step = (cb.cur_step_num - 1) % cb.batch_num + 1
        if np.isnan(loss) or np.isinf(loss):
            raise ValueError(f"epoch: {cb.cur_epoch_num} step: {step}. Invalid loss, terminating training.")
        if self._per_print_times != 0 and cb.cur_step_num - self._last_print_time >= self._per_print_times:
            self._last_print_time = cb.cur_step_num
            print(f"epoch: {cb.cur_epoch_num} step: {step}, loss is {loss}", flush=True)


class TimeMonitor(Callback):
    """Prints each epoch's time and its time per step."""

    def __init__(self, data_size=None, data_time=False):
        if data_time:
            raise NotImplementedError("For 'TimeMonitor', autopar does not time the data pipeline (data_time must be False).")
        self.data_size = data_size

    def epoch_begin(self, run_context):
        self._started = time.perf_counter()

    def epoch_end(self, run_context):
        cb = run_context.original_args()
        ms = (time.perf_counter() - self._started) * 1000.0
        steps = cb.batch_num or self.data_size
        print(f"Train epoch time: {ms:.3f} ms, per step time: {ms / max(steps, 1):.3f} ms", flush=True)


class CheckpointConfig:
    def __init__(self, save_checkpoint_steps=1, save_checkpoint_seconds=0, keep_checkpoint_max=5, keep_checkpoint_per_n_minutes=0,
                 integrated_save=True, async_save=False, saved_network=None, append_info=None, enc_key=None, enc_mode="AES-GCM",
                 exception_save=False, **kwargs):
        if enc_key is not None:
            raise ValueError("For 'CheckpointConfig', encrypted checkpoints are not supported by autopar (enc_key must be None).")
        if not integrated_save:
            raise NotImplementedError("For 'CheckpointConfig', autopar's ModelCheckpoint saves whole tensors (integrated_save=True).")
        if save_checkpoint_seconds or keep_checkpoint_per_n_minutes or exception_save:
            raise NotImplementedError(
                "For 'CheckpointConfig', autopar saves by steps: save_checkpoint_seconds, keep_checkpoint_per_n_minutes and "
                "exception_save are not supported."
            )
        if append_info is not None and not isinstance(append_info, list):
            raise TypeError(f"For 'CheckpointConfig', 'append_info' must be a list, but got {type(append_info)}.")
        self.save_checkpoint_steps = save_checkpoint_steps
        self.keep_checkpoint_max = keep_checkpoint_max
        self.saved_network = saved_network
        self.append_info = append_info


class ModelCheckpoint(Callback):
    """Saves the train network's parameters (whole tensors) and its optimizer's state under
    MindSpore's names (only the network's with ``saved_network``) to
    ``{directory}/{prefix}-{epoch}_{step}.ckpt`` every ``save_checkpoint_steps`` steps, keeping the
    newest ``keep_checkpoint_max``."""

    def __init__(self, prefix="CKP", directory=None, config=None):
        self._prefix = prefix
        self._directory = directory or os.getcwd()
        self._config = config or CheckpointConfig()
        self._saved = []

    def step_end(self, run_context):
        cb = run_context.original_args()
        every = self._config.save_checkpoint_steps
        if every and cb.cur_step_num % every == 0:
            self._save(cb)

    def end(self, run_context):
        cb = run_context.original_args()
        every = self._config.save_checkpoint_steps
        if not every or cb.cur_step_num % every != 0:
            self._save(cb)

    def _save(self, cb):
        from ..train.serialization import save_checkpoint

        step = (cb.cur_step_num - 1) % cb.batch_num + 1
        path = os.path.join(self._directory, f"{self._prefix}-{cb.cur_epoch_num}_{step}.ckpt")
        cb._sync_params()
        network = self._config.saved_network or cb.train_network
        append = {}
        for item in self._config.append_info or []:
            if item == "epoch_num":
                append["epoch_num"] = cb.cur_epoch_num
            elif item == "step_num":
                append["step_num"] = cb.cur_step_num
            elif isinstance(item, dict):
                append.update(item)
            else:
                raise ValueError(f"For 'CheckpointConfig', 'append_info' holds 'epoch_num', 'step_num' or dicts, but got {item!r}.")
        if self._config.saved_network is None:
            # The train network's checkpoint holds the optimizer's state too, as MindSpore's does.
            saver = getattr(cb, "_optimizer_checkpoint", None)
            state = saver() if saver is not None else {}
            append = {**state, **append}
        save_checkpoint(network, path, append_dict=append or None)
        self._saved.append(path)
        keep = self._config.keep_checkpoint_max
        while keep and len(self._saved) > keep:
            old = self._saved.pop(0)
            if os.path.exists(old):
                os.remove(old)

    @property
    def latest_ckpt_file_name(self):
        return self._saved[-1] if self._saved else None
