"""``plan`` and ``train``: the ``autopar plan`` / ``autopar train`` command lines, driven from
Python with their flags as keyword arguments, run in this process.

A keyword is its flag with ``_`` for ``-`` (``batch_size=64`` is ``--batch-size=64``); ``True``
gives a bare flag, ``False`` and ``None`` leave it out, a list or tuple is joined with commas
(``input_shape=[28, 28]`` is ``--input-shape=28,28``, ``pipeline_split=["a", "b"]`` names two
ops). ``parallel`` takes a dict of ``set_auto_parallel_context`` options (``--parallel KEY=VALUE``
each; dict, list and ``None`` values as JSON); ``verbose=N`` logs on stderr as ``-v`` N times
does (``0``: not at all; or set ``AUTOPAR_LOG``)::

    from autopar import cli
    report = cli.plan(model="gpt", devices=8, parallel={"pipeline_stages": 2}, micro_batches=4)
    summary = cli.train(model="mlp", data="synthetic", steps=20, devices=4, verify=True)
    summary["losses"][-1], summary["verify"]["ok"]
"""

import json

from . import _native

__all__ = ["plan", "train", "command_line"]


def _value(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None or isinstance(v, (dict, list, tuple)):
        return json.dumps(v)
    return str(v)


def command_line(command, **options):
    """The words of ``autopar COMMAND`` for these keyword arguments (what ``plan``/``train`` run)."""
    words = [command]
    for key, value in options.items():
        flag = "--" + key.replace("_", "-")
        if value is None or value is False:
            continue
        if key == "verbose":  # verbose=2 is -vv: logs on stderr
            if not isinstance(value, int) or value < 0:
                raise ValueError(f"'verbose' must be a count of 0 or more, but got {value!r}.")
            if value > 0:
                words.append("-" + "v" * value)
            continue
        # One word per flag and value (--devices=-1 stays a value, not a flag).
        if value is True:
            words.append(flag)
        elif key == "parallel":
            if not isinstance(value, dict):
                raise TypeError(f"'parallel' must be a dict of set_auto_parallel_context options, but got {type(value)}.")
            for k, v in value.items():
                words.append(f"{flag}={k}={_value(v)}")
        elif isinstance(value, (list, tuple)):
            words.append(f"{flag}=" + ",".join(_value(v) for v in value))
        else:
            words.append(f"{flag}={_value(value)}")
    return words


def _run(command, options):
    if "json" in options:
        raise TypeError(f"'{command}' returns a dict: 'json' is always on.")
    words = command_line(command, **options)
    layouts = options.get("mindspore_layouts")
    if not layouts:
        words.append("--json")
    out = _native.run_cli(words)
    return out if layouts else json.loads(out)


def plan(**options):
    """Plan a job without training it; returns the plan report (``autopar plan --json``) as a
    dict: every op's strategy and its source, the layouts, redistributions, gradient buckets,
    communication per step and memory per device. With ``mindspore_layouts=True``, MindSpore's
    ``parameter_layout_dict`` lines as a string."""
    return _run("plan", options)


def train(**options):
    """Train in this process (``--devices N`` simulated devices as threads) and return the
    summary (``autopar train --json``) as a dict: losses, samples/s, evaluation, checkpoint and
    strategy files, and with ``verify=True`` the comparison with stand-alone (``verify.ok``)."""
    return _run("train", options)
