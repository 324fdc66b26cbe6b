#!/usr/bin/env bash
# Fuzzing: every target in fuzz/ (one per parser of outside input) runs from its committed
# corpus under libFuzzer with AddressSanitizer, with a memory cap so that an allocation the
# input does not justify is a finding. Needs the nightly toolchain; installs cargo-fuzz when
# missing. The corpora and past findings also run under `cargo test`
# (crates/autopar-fuzz/tests/corpora.rs).
#
# Usage: .ci/fuzz.sh [SECONDS]                   each target for SECONDS (default 20; CI)
#        .ci/fuzz.sh --runs N [--merge] [TARGET...]
#                                                each target (or the ones named) for N executions,
#                                                e.g. --runs 10000000 for a long campaign; with
#                                                --merge, the inputs that reached new code are
#                                                added to fuzz/corpus/TARGET (libFuzzer -merge=1).
# On a terminal a progress line shows each target's executions and rate (AUTOPAR_PROGRESS=0
# hides it); every target ends with one line: executions, seconds, finding or not.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=20 runs=0 merge=0 only=()
while [ $# -gt 0 ]; do
    case "$1" in
        --runs) runs=${2:?--runs needs a number}; shift 2 ;;
        --merge) merge=1; shift ;;
        -h | --help) sed -n '2,15p' "$0"; exit 0 ;;
        [0-9]*) seconds=$1; shift ;;
        -*) echo "fuzz: unknown option $1 (see --help)" >&2; exit 2 ;;
        *) only+=("$1"); shift ;;
    esac
done
if ! [[ "$runs" =~ ^(0|[1-9][0-9]*)$ ]] || ! [[ "$seconds" =~ ^[0-9]+$ ]]; then
    echo "fuzz: --runs and SECONDS take whole numbers, e.g. --runs 10000000 (got --runs $runs, SECONDS $seconds)" >&2
    exit 2
fi
runs_flag=-1
if [ "$runs" != 0 ]; then seconds=0 runs_flag=$runs; fi

if ! cargo +nightly --version >/dev/null 2>&1; then
    echo "fuzz: no nightly toolchain (rustup toolchain install nightly); skipping the fuzz runs" >&2
    exit 0
fi
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
    echo "fuzz: installing cargo-fuzz"
    cargo +nightly install cargo-fuzz --locked --quiet
fi

targets=$(cargo +nightly fuzz list)
if [ ${#only[@]} -gt 0 ]; then
    for t in "${only[@]}"; do
        grep -qx "$t" <<<"$targets" || { echo "fuzz: no target $t; the targets are: $(echo $targets)" >&2; exit 2; }
    done
    targets="${only[*]}"
fi
progress=0
if [ -t 2 ] && [ "${AUTOPAR_PROGRESS:-1}" != 0 ]; then progress=1; fi
work=$(mktemp -d)
pid=""
# Ctrl-C or a kill stops the running fuzzer too (it runs in the background of this script).
trap 'rm -rf "$work"' EXIT
trap '[ -n "$pid" ] && pkill -TERM -P "$pid" 2>/dev/null; [ -n "$pid" ] && kill "$pid" 2>/dev/null; exit 130' INT TERM
cargo +nightly fuzz build -O
count=$(wc -w <<<"$targets")
failed=0 i=0
for t in $targets; do
    i=$((i + 1))
    # A scratch copy of the corpus: the run adds inputs there, not to the repository.
    mkdir -p "$work/$t"
    cp fuzz/corpus/"$t"/* "$work/$t"/
    start=$(date +%s)
    cargo +nightly fuzz run -O "$t" "$work/$t" -- -max_total_time="$seconds" -runs="$runs_flag" -rss_limit_mb=2048 \
        -malloc_limit_mb=512 -timeout=10 -max_len=65536 -print_final_stats=1 >"$work/$t.log" 2>&1 &
    pid=$!
    if [ "$progress" = 1 ]; then
        while kill -0 "$pid" 2>/dev/null; do
            # libFuzzer's status lines start with "#<executions>" and carry "exec/s: <rate>".
            last=$(grep -aoE '^#[0-9]+.*exec/s: [0-9]+' "$work/$t.log" 2>/dev/null | tail -1 || true)
            execs=$(sed -E 's/^#([0-9]+).*/\1/' <<<"$last")
            rate=$(sed -E 's/.*exec\/s: ([0-9]+)/\1/' <<<"$last")
            goal=$([ "$runs" != 0 ] && echo "/$runs" || echo "")
            printf '\r\033[K[%d/%d] %s: %s%s executions, %s/s, %ds' "$i" "$count" "$t" "${execs:-0}" "$goal" "${rate:-0}" \
                "$(($(date +%s) - start))" >&2
            sleep 1
        done
        printf '\r\033[K' >&2
    fi
    if wait "$pid"; then
        execs=$(grep -ao 'stat::number_of_executed_units: [0-9]*' "$work/$t.log" | awk '{print $2}' || true)
        echo "fuzz: [$i/$count] $t: $execs executions in $(($(date +%s) - start)) s, no finding"
        if [ "$merge" = 1 ]; then
            before=$(ls fuzz/corpus/"$t" | wc -l)
            cargo +nightly fuzz run -O "$t" fuzz/corpus/"$t" "$work/$t" -- -merge=1 -max_len=65536 >"$work/$t.merge.log" 2>&1 ||
                { tail -20 "$work/$t.merge.log" >&2; failed=1; }
            echo "fuzz: [$i/$count] $t: corpus $before -> $(ls fuzz/corpus/"$t" | wc -l) inputs"
        fi
    else
        failed=1
        tail -40 "$work/$t.log" >&2
        echo "fuzz: [$i/$count] $t: FINDING (the input is under fuzz/artifacts/$t; keep it in fuzz/regressions/$t once fixed)" >&2
    fi
done
exit $failed
