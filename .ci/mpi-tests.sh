#!/usr/bin/env bash
# MPI tests: build with --features mpi, run the collective conformance suite under mpirun with
# 2 and 4 processes, check that a failing rank ends the whole job with its message (never a
# hang), that parallel training over MPI equals the same job on in-process ranks, and the
# documentation's MPI commands. Called by .ci/run after the normal test run; exits non-zero on any
# failure. Installs OpenMPI and libclang (needed by the mpi crate's bindgen) when missing.
set -euo pipefail
cd "$(dirname "$0")/.."

have_libclang() {
    # libclang itself, not libclang-cpp (which other packages bring).
    ldconfig -p 2>/dev/null | grep -q 'libclang[-.0-9]*\.so' || ls /usr/lib/llvm-*/lib/libclang.so >/dev/null 2>&1
}
if ! command -v mpirun >/dev/null || ! command -v mpicc >/dev/null || ! have_libclang; then
    echo "mpi-tests: installing OpenMPI and libclang"
    if [ "$(id -u)" != 0 ]; then
        echo "mpi-tests: OpenMPI or libclang is missing and this is not root; install openmpi-bin libopenmpi-dev libclang-dev" >&2
        exit 1
    fi
    apt-get update
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends openmpi-bin libopenmpi-dev libclang-dev
fi

# Every temp folder of these checks (mktemp -d below) lives under one folder removed at exit.
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
export TMPDIR="$scratch"

flags=(--oversubscribe --mca btl_vader_single_copy_mechanism none)
if [ "$(id -u)" = 0 ]; then
    flags=(--allow-run-as-root "${flags[@]}")
fi

example="${CARGO_TARGET_DIR:-target}/debug/examples/mpi_collectives"
echo "mpi-tests: building autopar-comm with --features mpi"
cargo build -p autopar-comm --features mpi --examples

passed=0
failed=0
check() {
    if "$@"; then
        passed=$((passed + 1))
    else
        failed=$((failed + 1))
        echo "mpi-tests: FAILED: $*" >&2
    fi
}

suite() {
    local n=$1 out
    echo "mpi-tests: conformance suite under mpirun -n $n"
    out=$(timeout 300 mpirun -n "$n" "${flags[@]}" "$example" 2>&1) || { echo "$out" >&2; return 1; }
    echo "$out"
    [ "$(grep -c "of $n: .* checks passed" <<<"$out")" = "$n" ]
}

aborts() {
    local mode=$1 text=$2 out rc=0
    echo "mpi-tests: rank 3 of 4 ${mode}s; the job must end with its message"
    out=$(timeout 120 mpirun -n 4 "${flags[@]}" "$example" "$mode" 2>&1) || rc=$?
    if [ "$rc" = 0 ] || [ "$rc" = 124 ]; then
        echo "$out" >&2
        echo "mpi-tests: expected a non-zero exit without timeout, got $rc" >&2
        return 1
    fi
    if ! grep -q 'autopar\[3\]: ' <<<"$out" || ! grep -qF "$text" <<<"$out"; then
        echo "$out" >&2
        echo "mpi-tests: the job's output lacks autopar[3]: and \"$text\"" >&2
        return 1
    fi
}

check suite 2
check suite 4
check aborts fail "injected failure on rank 3"
check aborts panic "injected panic on rank 3"

exits() {
    local out rc=0
    echo "mpi-tests: rank 3 of 4 exits abruptly; mpirun must end the job"
    out=$(timeout 120 mpirun -n 4 "${flags[@]}" "$example" exit 2>&1) || rc=$?
    if [ "$rc" = 0 ] || [ "$rc" = 124 ]; then
        echo "$out" >&2
        echo "mpi-tests: expected a non-zero exit without timeout, got $rc" >&2
        return 1
    fi
}
check exits

# A parallel training job over MPI equals the same job on in-process ranks.
echo "mpi-tests: building autopar-runtime with --features mpi"
cargo build -p autopar-runtime --features mpi --example mpi_equals_local --example mpi_parameter_broadcast --example mpi_pipeline_predict
training() {
    local n=$1 mode=$2 out
    echo "mpi-tests: $mode training under mpirun -n $n equals LocalComm"
    out=$(timeout 300 mpirun -n "$n" "${flags[@]}" "${CARGO_TARGET_DIR:-target}/debug/examples/mpi_equals_local" "$mode" 2>&1) || { echo "$out" >&2; return 1; }
    echo "$out"
    grep -q "mpi-equals-local: OK" <<<"$out"
}
check training 2 semi_auto_parallel
check training 4 semi_auto_parallel
check training 2 data_parallel

# Pipeline inference over MPI: the outputs reach every rank with pipeline_result_broadcast and
# the last stage's alone without it, equal to the stand-alone forward.
pipeline_predict() {
    local out
    echo "mpi-tests: pipeline inference under mpirun -n 4"
    out=$(timeout 300 mpirun -n 4 "${flags[@]}" "${CARGO_TARGET_DIR:-target}/debug/examples/mpi_pipeline_predict" 2>&1) || { echo "$out" >&2; return 1; }
    echo "$out"
    grep -q "mpi-pipeline-predict: OK" <<<"$out"
}
check pipeline_predict

# parameter_broadcast over MPI: ranks that start from different values end with equal replicas
# and train bit for bit as in process; a wrong cur_rank on rank 1 fails every rank (no hang).
broadcast() {
    local n=$1 out
    echo "mpi-tests: parameter_broadcast under mpirun -n $n equals LocalComm"
    out=$(timeout 300 mpirun -n "$n" "${flags[@]}" "${CARGO_TARGET_DIR:-target}/debug/examples/mpi_parameter_broadcast" 2>&1) || { echo "$out" >&2; return 1; }
    echo "$out"
    grep -q "mpi-parameter-broadcast: OK" <<<"$out"
}
broadcast_refused() {
    local out rc=0
    echo "mpi-tests: parameter_broadcast with a wrong cur_rank on rank 1 of 4 fails the job"
    out=$(timeout 120 mpirun -n 4 "${flags[@]}" "${CARGO_TARGET_DIR:-target}/debug/examples/mpi_parameter_broadcast" bad 2>&1) || rc=$?
    if [ "$rc" = 0 ] || [ "$rc" = 124 ] || ! grep -q "cur_rank 0 is not this rank, which is rank 1" <<<"$out"; then
        echo "$out" >&2
        echo "mpi-tests: expected every rank to fail with the cur_rank error, got exit $rc" >&2
        return 1
    fi
}
check broadcast 2
check broadcast 4
check broadcast_refused
check training 4 data_parallel

# An autopar built without MPI support refuses to run under mpirun (instead of every process
# running the whole job), and `autopar launch` refuses to start it.
echo "mpi-tests: building autopar without MPI support"
cargo build -p autopar
nompi="$(mktemp -d)/autopar-no-mpi"
cp "${CARGO_TARGET_DIR:-target}/debug/autopar" "$nompi"
refuses_without_mpi() {
    local out rc=0
    echo "mpi-tests: mpirun -n 2 of an autopar without MPI support must refuse"
    out=$(timeout 120 mpirun -n 2 "${flags[@]}" "$nompi" train --model mlp --data synthetic --steps 2 --devices 2 2>&1) || rc=$?
    if [ "$rc" = 0 ] || [ "$rc" = 124 ] || ! grep -q "built without MPI support" <<<"$out" || grep -q "^trained" <<<"$out"; then
        echo "$out" >&2
        return 1
    fi
    out=$("$nompi" launch -n 2 -- "$nompi" train --model mlp --data synthetic --steps 2 2>&1) && { echo "$out" >&2; return 1; }
    grep -q "built without MPI support" <<<"$out" || { echo "$out" >&2; return 1; }
}
check refuses_without_mpi

# `mpirun -n N autopar train` equals the same job on N in-process ranks (the ResNet's
# data_parallel BatchNorm synchronises its statistics across the processes).
echo "mpi-tests: building autopar with --features mpi"
cargo build -p autopar --features mpi
train_cli() {
    local n=$1
    shift
    local bin="${CARGO_TARGET_DIR:-target}/debug/autopar" args=(train "$@" --devices "$n") mpi local
    echo "mpi-tests: mpirun -n $n autopar ${args[*]} equals the in-process run"
    mpi=$(timeout 300 mpirun -n "$n" "${flags[@]}" "$bin" "${args[@]}" 2>&1) || { echo "$mpi" >&2; return 1; }
    local=$("$bin" "${args[@]}" 2>&1) || { echo "$local" >&2; return 1; }
    echo "$mpi"
    [ "$(grep -E '^  (loss|eval)' <<<"$mpi")" = "$(grep -E '^  (loss|eval)' <<<"$local")" ] || { echo "$local" >&2; return 1; }
}
check train_cli 4 --model mlp --data synthetic --synthetic-samples 2048 --steps 20 --batch-size 32
check train_cli 2 --model resnet18 --width 4 --input-shape 3,16,16 --data synthetic --synthetic-samples 256 --steps 4 --batch-size 16 --parallel-mode data_parallel
# Pipelines (stages talking over blocking MPI sends) and gradient accumulation.
check train_cli 4 --model gpt --width 32 --depth 2 --heads 2 --input-shape 16 --num-classes 32 --data synthetic --synthetic-samples 256 --steps 4 --batch-size 16 --parallel pipeline_stages=2 --micro-batches 4
check train_cli 4 --model mlp --data synthetic --synthetic-samples 1024 --steps 6 --batch-size 32 --parallel pipeline_stages=4 --parallel 'pipeline_config={"pipeline_scheduler":"gpipe"}' --micro-batches 8
check train_cli 4 --model resnet50 --width 4 --input-shape 3,16,16 --data synthetic --synthetic-samples 128 --steps 3 --batch-size 16 --parallel pipeline_stages=2 --micro-batches 4
# Interleaved: 2 chunks per stage, the last stage's first chunk sending back to stage 0.
check train_cli 4 --model gpt --width 32 --depth 4 --heads 2 --input-shape 16 --num-classes 32 --data synthetic --synthetic-samples 256 --steps 4 --batch-size 16 --parallel pipeline_stages=2 --parallel 'pipeline_config={"pipeline_interleave":true}' --micro-batches 4
check train_cli 2 --model mlp --data synthetic --synthetic-samples 1024 --steps 6 --batch-size 16 --grad-accumulation 2
# The parallel optimizer inside a pipeline (each stage's replicas shard its parameters).
check train_cli 4 --model gpt --width 32 --depth 2 --heads 2 --input-shape 16 --num-classes 32 --data synthetic --synthetic-samples 256 --steps 4 --batch-size 16 --parallel pipeline_stages=2 --micro-batches 4 --parallel enable_parallel_optimizer=true --parallel 'parallel_optimizer_config={"parallel_optimizer_threshold":0,"gradient_accumulation_shard":true}'
# optimizer_level level3: each sharded weight all-gathered per use inside the program, in a
# pipeline's stages too.
check train_cli 4 --model gpt --width 32 --depth 2 --heads 2 --input-shape 16 --num-classes 32 --data synthetic --synthetic-samples 256 --steps 4 --batch-size 16 --parallel-mode data_parallel --parallel enable_parallel_optimizer=true --parallel 'parallel_optimizer_config={"parallel_optimizer_threshold":0,"optimizer_level":"level3"}'
check train_cli 4 --model gpt --width 32 --depth 2 --heads 2 --input-shape 16 --num-classes 32 --data synthetic --synthetic-samples 256 --steps 4 --batch-size 16 --parallel pipeline_stages=2 --micro-batches 4 --parallel enable_parallel_optimizer=true --parallel 'parallel_optimizer_config={"parallel_optimizer_threshold":0,"optimizer_level":"level3"}'
# optimizer_level level2: each gradient reduce-scattered inside the backward pass, over a shard
# group of 2 of the 4 replicas (the parts then all-gathered over the other pair).
check train_cli 4 --model gpt --width 32 --depth 2 --heads 2 --input-shape 16 --num-classes 32 --data synthetic --synthetic-samples 256 --steps 4 --batch-size 16 --parallel-mode data_parallel --parallel enable_parallel_optimizer=true --parallel 'parallel_optimizer_config={"parallel_optimizer_threshold":0,"optimizer_level":"level2","optimizer_weight_shard_size":2}'
# auto_parallel: dynamic_programming, with communication nearly free in MindSpore's cost model
# (costmodel_beta=0.01), splits some of ResNet-50's convolutions over channels on 8 ranks.
check train_cli 8 --model resnet50 --width 8 --input-shape 3,32,32 --data synthetic --synthetic-samples 256 --steps 3 --batch-size 64 --parallel-mode auto_parallel --parallel search_mode=dynamic_programming --parallel costmodel_beta=0.01 --eval false

# Recomputation under MPI: every block recomputed in the backward pass (the ResNet's
# synchronised BatchNorm statistics and the pipeline's micro-batches replayed across the
# processes) gives the in-process losses of the run that recomputes nothing, line for line.
recompute_cli() {
    local n=$1
    shift
    local bin="${CARGO_TARGET_DIR:-target}/debug/autopar" args=(train "$@" --devices "$n") mpi local
    echo "mpi-tests: mpirun -n $n autopar ${args[*]} --recompute blocks equals the in-process run without"
    mpi=$(timeout 300 mpirun -n "$n" "${flags[@]}" "$bin" "${args[@]}" --recompute blocks 2>&1) || { echo "$mpi" >&2; return 1; }
    local=$("$bin" "${args[@]}" --recompute none 2>&1) || { echo "$local" >&2; return 1; }
    echo "$mpi"
    grep -q '^  recomputation: ' <<<"$mpi" || { echo "mpi-tests: the run did not recompute" >&2; return 1; }
    [ "$(grep -E '^  (loss|eval)' <<<"$mpi")" = "$(grep -E '^  (loss|eval)' <<<"$local")" ] || { echo "$local" >&2; return 1; }
}
check recompute_cli 2 --model resnet18 --width 4 --input-shape 3,16,16 --data synthetic --synthetic-samples 256 --steps 4 --batch-size 16 --parallel-mode data_parallel
check recompute_cli 4 --model gpt --width 32 --depth 2 --heads 2 --input-shape 16 --num-classes 32 --data synthetic --synthetic-samples 256 --steps 4 --batch-size 16 --parallel pipeline_stages=2 --micro-batches 4

# `--report` under mpirun: rank 0 writes the page, with every rank's measured peak beside the
# plan (each process one rank).
report_page() {
    local bin="${CARGO_TARGET_DIR:-target}/debug/autopar" dir out
    dir=$(mktemp -d)
    echo "mpi-tests: mpirun -n 4 autopar train --report writes every rank's measured memory"
    out=$(timeout 300 mpirun -n 4 "${flags[@]}" "$bin" train --model mlp --data synthetic --synthetic-samples 512 --steps 3 --devices 4 --eval false --report "$dir/run.html" 2>&1) || { echo "$out" >&2; return 1; }
    grep -q "measured: its process's peak resident (VmHWM)" "$dir/run.html" || { echo "mpi-tests: the page has no measured column" >&2; return 1; }
    # Four rows, each with a measured peak of more than 1 MiB (the last number of its row).
    [ "$(sed -n '/id="memory-table"/,/<\/table>/p' "$dir/run.html" | grep -o '<tr><td class="num" data-v="[0-9]*">' | wc -l)" = 4 ] || { echo "mpi-tests: not 4 ranks in the memory table" >&2; return 1; }
    python3 - "$dir/run.html" <<'PY'
import re, sys
page = open(sys.argv[1]).read()
table = page[page.index('id="memory-table"'):]
table = table[:table.index('</table>')]
rows = table.split('<tr>')[2:]
# The measured cell is the row's ninth, after the rank and seven planned figures.
cells = [re.findall(r'<td[^>]*>', r) for r in rows]
peaks = [float(re.search(r'data-v="([0-9.e+]+)"', c[8]).group(1)) for c in cells]
assert len(peaks) == 4 and all(p > 1 << 20 for p in peaks), peaks
PY
}
check report_page

# A run saved on 4 in-process devices under a model-parallel strategy resumes under
# `mpirun -n 2` (data_parallel) exactly as it resumes on 2 in-process devices.
resume_anywhere() {
    local bin="${CARGO_TARGET_DIR:-target}/debug/autopar" dir out mpi local
    dir=$(mktemp -d)
    local args=(train --model mlp --data synthetic --synthetic-samples 1024 --batch-size 32)
    echo "mpi-tests: a 4-device checkpoint resumed by mpirun -n 2 equals the in-process resume"
    out=$("$bin" "${args[@]}" --steps 8 --devices 4 --strategy fixtures/autopar/strategies/mp4.json --checkpoint-dir "$dir/a" 2>&1) || { echo "$out" >&2; return 1; }
    mpi=$(timeout 300 mpirun -n 2 "${flags[@]}" "$bin" "${args[@]}" --steps 16 --devices 2 --parallel-mode data_parallel --resume "$dir/a" --checkpoint-dir "$dir/mpi" 2>&1) || { echo "$mpi" >&2; return 1; }
    local=$("$bin" "${args[@]}" --steps 16 --devices 2 --parallel-mode data_parallel --resume "$dir/a" --checkpoint-dir "$dir/local" 2>&1) || { echo "$local" >&2; return 1; }
    echo "$mpi"
    grep -q "step 8 to 16" <<<"$mpi" || { echo "$mpi" >&2; return 1; }
    [ "$(grep -E '^  (loss|eval)' <<<"$mpi")" = "$(grep -E '^  (loss|eval)' <<<"$local")" ] || { echo "$local" >&2; return 1; }
    # `autopar eval` of the 4 ranks' folder: each of 2 processes reads its own pieces.
    echo "mpi-tests: mpirun -n 2 autopar eval of the 4-device folder equals the in-process evaluation"
    local eval=(eval "$dir/a" --model mlp --data synthetic --synthetic-samples 1024 --devices 2 --parallel-mode auto_parallel)
    mpi=$(timeout 300 mpirun -n 2 "${flags[@]}" "$bin" "${eval[@]}" 2>&1) || { echo "$mpi" >&2; return 1; }
    local=$("$bin" "${eval[@]}" 2>&1) || { echo "$local" >&2; return 1; }
    echo "$mpi"
    grep -q '^eval: accuracy' <<<"$mpi" || { echo "$mpi" >&2; return 1; }
    [ "$(grep '^eval:' <<<"$mpi")" = "$(grep '^eval:' <<<"$local")" ] || { echo "$local" >&2; return 1; }
    # `autopar predict` over a pipeline of 2 stages: the last stage's rank (process 1) writes
    # the file, in place before rank 0 reports it, the same bytes as in process.
    echo "mpi-tests: mpirun -n 2 autopar predict through a pipeline writes the in-process predictions"
    local predict=(predict "$dir/a" --model mlp --data synthetic --synthetic-samples 1024 --devices 2
        --parallel-mode semi_auto_parallel --parallel pipeline_stages=2)
    mpi=$(timeout 300 mpirun -n 2 "${flags[@]}" "$bin" "${predict[@]}" --output "$dir/mpi.safetensors" 2>&1) || { echo "$mpi" >&2; return 1; }
    grep -q "predictions written to $dir/mpi.safetensors" <<<"$mpi" || { echo "$mpi" >&2; return 1; }
    [ -f "$dir/mpi.safetensors" ] || { echo "rank 0 reported $dir/mpi.safetensors before it was in place" >&2; return 1; }
    "$bin" "${predict[@]}" --output "$dir/local.safetensors" >/dev/null 2>&1 || return 1
    cmp "$dir/mpi.safetensors" "$dir/local.safetensors" || { echo "the predictions differ between mpirun and in process" >&2; return 1; }
}
check resume_anywhere

# The long run of crates/autopar/tests/long_run.rs across backends: 8 in-process devices run
# 5,000 steps (a checkpoint every 500); that run stopped at a random checkpoint continues under
# mpirun -n 8, and the MPI run stopped at a later random checkpoint continues in process. Every
# checkpoint written after each stop equals the uninterrupted run's, byte for byte (both
# backends reduce in rank order).
long_run_across_backends() {
    local bin="${CARGO_TARGET_DIR:-target}/debug/autopar" dir k1 k2 r s out
    dir=$(mktemp -d)
    cat >"$dir/strategy8.json" <<'JSON'
{"current_stage": 2, "parallel_strategy_item": {
  "MatMul_fc1.weight": {"stage": 0, "parallel_strategy": [[2, 1], [4, 1]]},
  "MatMul_fc2.weight": {"stage": 0, "parallel_strategy": [[2, 4], [1, 4]]}},
  "parallel_layout_item": {}}
JSON
    local args=(train --model mlp --width 32 --data synthetic --synthetic-samples 2048 --batch-size 32 --devices 8
        --strategy "$dir/strategy8.json" --optimizer adamw --lr 0.003 --schedule cosine --warmup-steps 100 --steps 5000
        --checkpoint-every 500 --keep-checkpoint-max 0 --log-every 0 --eval false)
    k1=$(((RANDOM % 8 + 1) * 500))
    k2=$((k1 + (RANDOM % ((4500 - k1) / 500) + 1) * 500))
    echo "mpi-tests: 8 devices x 5000 steps in process; stopped at step $k1, resumed by mpirun -n 8; stopped at $k2, resumed in process"
    # The checkpoints of run $1 up to step $3, as a run stopped there left them, in folder $2.
    stopped_at() {
        for r in 0 1 2 3 4 5 6 7; do
            mkdir -p "$2/rank_$r"
            for s in $(seq 500 500 "$3"); do cp "$1/rank_$r/mlp-${s}_$r.safetensors" "$2/rank_$r/" || return 1; done
        done
        cp "$1/strategy.json" "$2/"
    }
    # Every checkpoint of run $1 after step $2 equals the uninterrupted run's.
    same_after() {
        for s in $(seq $(($2 + 500)) 500 5000); do
            for r in 0 1 2 3 4 5 6 7; do
                cmp "$dir/whole/rank_$r/mlp-${s}_$r.safetensors" "$1/rank_$r/mlp-${s}_$r.safetensors" || return 1
            done
        done
    }
    out=$("$bin" "${args[@]}" --checkpoint-dir "$dir/whole" 2>&1) || { echo "$out" >&2; return 1; }
    grep -E "^  memory: peak RSS .* at step 500, .* at step 5000" <<<"$out" || { echo "$out" >&2; return 1; }
    stopped_at "$dir/whole" "$dir/mpi" "$k1" || return 1
    out=$(timeout 600 mpirun -n 8 "${flags[@]}" "$bin" "${args[@]}" --checkpoint-dir "$dir/mpi" --resume "$dir/mpi" 2>&1) || { echo "$out" >&2; return 1; }
    grep -q "step $k1 to 5000" <<<"$out" || { echo "$out" >&2; return 1; }
    same_after "$dir/mpi" "$k1" || return 1
    stopped_at "$dir/mpi" "$dir/local" "$k2" || return 1
    out=$("$bin" "${args[@]}" --checkpoint-dir "$dir/local" --resume "$dir/local" 2>&1) || { echo "$out" >&2; return 1; }
    grep -q "step $k2 to 5000" <<<"$out" || { echo "$out" >&2; return 1; }
    same_after "$dir/local" "$k2"
}
check long_run_across_backends

# The parallel optimizer under mpirun -n 4 (semi_auto, shards over part of each replica group,
# AdamW): the same losses, evaluation and group-info files as 4 in-process devices.
parallel_optimizer() {
    local bin="${CARGO_TARGET_DIR:-target}/debug/autopar" dir mpi local
    dir=$(mktemp -d)
    local args=(train --model mlp --data synthetic --synthetic-samples 1024 --batch-size 32 --steps 6 --devices 4 --optimizer adamw
        --strategy fixtures/autopar/strategies/mp4.json --parallel enable_parallel_optimizer=true
        --parallel 'parallel_optimizer_config={"parallel_optimizer_threshold": 0, "optimizer_weight_shard_size": 2}')
    echo "mpi-tests: an optimizer-sharded run under mpirun -n 4 equals 4 in-process devices"
    mkdir -p "$dir/mpi" "$dir/local"
    mpi=$(timeout 300 mpirun -n 4 "${flags[@]}" "$bin" "${args[@]}" --parallel group_ckpt_save_file="$dir/mpi/g.pb" 2>&1) || { echo "$mpi" >&2; return 1; }
    local=$("$bin" "${args[@]}" --parallel group_ckpt_save_file="$dir/local/g.pb" 2>&1) || { echo "$local" >&2; return 1; }
    echo "$mpi"
    [ "$(grep -E '^  (loss|eval)' <<<"$mpi")" = "$(grep -E '^  (loss|eval)' <<<"$local")" ] || { echo "$local" >&2; return 1; }
    for r in 0 1 2 3; do cmp "$dir/mpi/g_rank$r.pb" "$dir/local/g_rank$r.pb" || return 1; done
}
check parallel_optimizer

# The library examples under mpirun: one process per rank, each checked equal to stand-alone
# (which rank 0 runs in process) by the example itself.
echo "mpi-tests: building the autopar examples with --features mpi"
cargo build -p autopar --features mpi --examples
library_example() {
    local n=$1 name=$2 out
    echo "mpi-tests: mpirun -n $n examples/$name"
    out=$(timeout 300 mpirun -n "$n" "${flags[@]}" "${CARGO_TARGET_DIR:-target}/debug/examples/$name" 2>&1) || { echo "$out" >&2; return 1; }
    echo "$out"
    grep -q "beside one device" <<<"$out"
}
check library_example 8 custom_network
check library_example 4 pipeline_stages

# global_rank is checked against the process's MPI rank, and `autopar launch` starts an MPI build.
global_rank_mismatch() {
    local bin="${CARGO_TARGET_DIR:-target}/debug/autopar" out rc=0
    echo "mpi-tests: global_rank=1 on every process of mpirun -n 2 must be refused by rank 0"
    out=$(timeout 120 mpirun -n 2 "${flags[@]}" "$bin" train --model mlp --data synthetic --steps 2 --devices 2 --parallel global_rank=1 2>&1) || rc=$?
    if [ "$rc" = 0 ] || [ "$rc" = 124 ] || ! grep -q "global_rank 1 does not match this process, rank 0 of 2" <<<"$out"; then
        echo "$out" >&2
        return 1
    fi
    echo "mpi-tests: autopar launch -n 2 of an MPI build trains"
    out=$(timeout 300 "$bin" launch -n 2 -- "$bin" train --model mlp --data synthetic --synthetic-samples 512 --steps 4 --devices 2 2>&1) || { echo "$out" >&2; return 1; }
    grep -q "^trained mlp for 4 steps" <<<"$out" || { echo "$out" >&2; return 1; }
}
check global_rank_mismatch

# A rank killed with SIGKILL in the middle of training: the job ends within 30 s with an error
# naming that rank, and no process of the job is left behind.
killed_rank() {
    local bin="${CARGO_TARGET_DIR:-target}/debug/autopar" dir pid victim rank start took rc=0 i p
    dir=$(mktemp -d)
    echo "mpi-tests: SIGKILL one rank of mpirun -n 4 autopar train mid-run"
    mpirun -n 4 "${flags[@]}" "$bin" train --model mlp --data synthetic --synthetic-samples 4096 --batch-size 32 --epochs 1000 \
        --devices 4 --eval false --log-every 1 >"$dir/out" 2>&1 &
    pid=$!
    # Wait until training prints its first steps, then pick a rank process.
    for i in $(seq 1 600); do
        grep -q "step: 2," "$dir/out" 2>/dev/null && break
        sleep 0.1
    done
    victim=""
    for p in $(pgrep -f "$bin train --model mlp --data synthetic --synthetic-samples 4096" || true); do
        rank=$(tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | sed -n 's/^OMPI_COMM_WORLD_RANK=//p')
        if [ "$rank" = 2 ]; then victim=$p; fi
    done
    if [ -z "$victim" ]; then
        cat "$dir/out" >&2
        echo "mpi-tests: no rank 2 process found" >&2
        kill "$pid" 2>/dev/null || true
        return 1
    fi
    start=$(date +%s%N)
    kill -9 "$victim"
    for i in $(seq 1 600); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    wait "$pid" || rc=$?
    took=$((($(date +%s%N) - start) / 1000000))
    echo "mpi-tests: the job ended ${took} ms after rank 2 was killed, exit code $rc:"
    grep -E "rank 2 .*(signal 9|Killed)" "$dir/out" || true
    sleep 1
    if [ "$rc" = 0 ] || [ "$took" -gt 30000 ] || ! grep -qE "rank 2 .*(signal 9|Killed)" "$dir/out"; then
        cat "$dir/out" >&2
        return 1
    fi
    if pgrep -f "$bin train --model mlp --data synthetic --synthetic-samples 4096" >/dev/null; then
        echo "mpi-tests: orphan processes left:" >&2
        pgrep -af "$bin train" >&2
        pkill -9 -f "$bin train --model mlp --data synthetic --synthetic-samples 4096" || true
        return 1
    fi
}
check killed_rank

# The ```sh mpi commands of README.md and docs/ (.ci/doc-commands.sh), run with this MPI build.
doc_commands() {
    echo "mpi-tests: the documentation's MPI commands"
    AUTOPAR_BIN="${CARGO_TARGET_DIR:-target}/debug/autopar" bash .ci/doc-commands.sh --mpi
}
check doc_commands

echo "mpi-tests: cargo test -p autopar-comm --features mpi (includes the mpirun tests)"
check cargo test -p autopar-comm --features mpi

echo "mpi-tests: $passed passed, $failed failed"
[ "$failed" = 0 ]
