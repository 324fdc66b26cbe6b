#!/usr/bin/env bash
# Fuzzing: every target in fuzz/ (one per parser of outside input) runs for a short bounded time
# from its committed corpus, under libFuzzer with AddressSanitizer, with a memory cap so that an
# allocation the input does not justify is a finding. Usage: .ci/fuzz.sh [SECONDS_PER_TARGET]
# (default 20). Needs the nightly toolchain; installs cargo-fuzz when missing. The corpora and
# past findings also run under `cargo test` (crates/autopar-fuzz/tests/corpora.rs).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-20}

if ! cargo +nightly --version >/dev/null 2>&1; then
    echo "fuzz: no nightly toolchain (rustup toolchain install nightly); skipping the fuzz runs" >&2
    exit 0
fi
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
    echo "fuzz: installing cargo-fuzz"
    cargo +nightly install cargo-fuzz --locked --quiet
fi

targets=$(cargo +nightly fuzz list)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cargo +nightly fuzz build -O
failed=0
for t in $targets; do
    # A scratch copy of the corpus: the run adds inputs there, not to the repository.
    mkdir -p "$work/$t"
    cp fuzz/corpus/"$t"/* "$work/$t"/
    if cargo +nightly fuzz run -O "$t" "$work/$t" -- -max_total_time="$seconds" -rss_limit_mb=2048 -malloc_limit_mb=512 \
        -timeout=10 -max_len=65536 -print_final_stats=1 >"$work/$t.log" 2>&1; then
        echo "fuzz: $t: $(grep -o 'stat::number_of_executed_units: [0-9]*' "$work/$t.log" | awk '{print $2}') executions, no finding"
    else
        failed=1
        tail -40 "$work/$t.log" >&2
        echo "fuzz: $t: FINDING (the input is under fuzz/artifacts/$t; keep it in fuzz/regressions/$t once fixed)" >&2
    fi
done
exit $failed
