"""The package's transform_checkpoints beside MindSpore's on the same files, side by side.

    AUTOPAR_BENCH_KEEP=/tmp/b cargo bench -p autopar-checkpoint --bench transform   # 1 GiB model, 8 ranks
    python crates/autopar-py/bench/versus_mindspore.py /tmp/b [python-with-mindspore] [--repeat N]

Each tool runs in its own child process (its peak RSS is the child's ru_maxrss), transforming
`DIR/src` (8 ranks, (2,4) model parallel) to 4 ranks data parallel; the outputs are compared byte
for byte. The interpreter given second (default: this one) must have mindspore installed;
without it only autopar runs. With `--repeat N` the two run N times each, interleaved and in
alternating order (autopar first, then MindSpore first, ...), and the medians are compared.
"""

import filecmp
import statistics
import os
import shutil
import subprocess
import sys
import time

CHILD = r"""
import resource, sys, time
which, src, dst, ss, ds = sys.argv[1:6]
if which == "autopar":
    import autopar as ms
else:
    import mindspore as ms
t = time.perf_counter()
ms.transform_checkpoints(src, dst, "net_", ss, ds)
print(time.perf_counter() - t, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def run(python, which, base, dst):
    shutil.rmtree(dst, ignore_errors=True)
    subprocess.run(["sync"], check=True)
    env = dict(os.environ, AUTOPAR_PROGRESS="0", GLOG_v="3")
    args = [python, "-c", CHILD, which, f"{base}/src", dst, f"{base}/src_strategy.ckpt", f"{base}/dp4_strategy.ckpt"]
    out = subprocess.run(args, check=True, capture_output=True, text=True, env=env, cwd="/tmp")
    secs, kib = out.stdout.strip().splitlines()[-1].split()
    return float(secs), int(kib) / 1024


def main():
    args = sys.argv[1:]
    repeat = 1
    if "--repeat" in args:
        k = args.index("--repeat")
        repeat = int(args[k + 1])
        del args[k : k + 2]
    base = args[0]
    ms_python = args[1] if len(args) > 1 else sys.executable
    size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(f"{base}/src") for f in fs)
    print(f"source: {size / 2**30:.2f} GiB in 8 rank files; destination: 4 ranks data parallel; {repeat} run(s) each, interleaved")
    runs = {"autopar": [], "mindspore": []}
    same = None
    for i in range(repeat):
        order = ["autopar", "mindspore"] if i % 2 == 0 else ["mindspore", "autopar"]
        for which in order:
            if which == "mindspore" and runs["mindspore"] is None:
                continue
            python = sys.executable if which == "autopar" else ms_python
            try:
                secs, mib = run(python, which, base, f"{base}/dst_{which}")
            except subprocess.CalledProcessError as e:
                print(f"mindspore did not run: {e.stderr.strip().splitlines()[-1] if e.stderr else e}")
                runs["mindspore"] = None
                continue
            runs[which].append((secs, mib))
            print(f"  run {i + 1}: {which:<10} {secs:7.2f} s   peak RSS {mib:7.0f} MiB")
        if runs["mindspore"]:
            same = (same is not False) and all(
                filecmp.cmp(f"{base}/dst_autopar/rank_{r}/net_{r}.ckpt", f"{base}/dst_mindspore/rank_{r}/net_{r}.ckpt", shallow=False)
                for r in range(4)
            )
    rows = {k: (statistics.median(s for s, _ in v), statistics.median(m for _, m in v)) for k, v in runs.items() if v}
    for name, (secs, mib) in rows.items():
        print(f"  median {name:<10} {secs:7.2f} s   peak RSS {mib:7.0f} MiB")
    if len(rows) == 2:
        a, m = rows["autopar"], rows["mindspore"]
        ratios = sorted(ms[0] / au[0] for au, ms in zip(runs["autopar"], runs["mindspore"]))
        print(
            f"  autopar: {m[0] / a[0]:.1f}x faster (per pair {ratios[0]:.1f}x to {ratios[-1]:.1f}x), "
            f"{m[1] / a[1]:.1f}x less memory; outputs byte-identical: {same}"
        )
    for d in ("dst_autopar", "dst_mindspore"):
        shutil.rmtree(f"{base}/{d}", ignore_errors=True)


if __name__ == "__main__":
    main()
