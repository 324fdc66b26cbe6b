#!/usr/bin/env bash
# Runs every command that README.md and docs/*.md show, so that no page goes stale. A command
# that fails ends the run with a non-zero exit, naming the page, the line and the command.
#
# What is run (the convention, also in docs/README.md): fenced code blocks, by info string.
#   ```sh            commands, one per line; a line ending in `\` goes on on the next; blank
#                    lines and lines starting with `#` are skipped. Each command runs in a bash
#                    of its own (pipefail on) and must exit 0.
#   ```sh mpi        commands that need an MPI build and mpirun: run with --mpi
#                    (.ci/mpi-tests.sh, with the MPI build as AUTOPAR_BIN).
#   ```sh python     commands of the Python package: run with --python (.ci/python-tests.sh,
#   ```python        with the package installed); a ```python block is one program, run by
#                    `python3` (tracebacks give the page's own line numbers).
#   ```sh ci         commands CI runs itself (the test command, the CI scripts): not run again;
#                    each line must be, word for word, a line of .ci/run or of a script beside it.
#   ```sh manual     commands CI cannot run (benchmarks, fuzz campaigns, real datasets): checked
#                    with `bash -n`, and every cargo package, bench, example or .ci script they
#                    name must exist; run them with --manual.
#   ```rust from=P   an excerpt of the repository file P: its lines must appear in P, in order
#                    and together, so the page changes when the file does.
#   ```LANG file=F   a file the page's later commands read (```toml file=run.toml): written
#                    to F in the page's scratch folder, in page order.
#   anything else    not run: ```text for output, ```toml, other ```rust.
# A ```bash, ```shell or ```console block, or an unknown tag after ```sh, is an error.
# Without --mpi or --python the script runs the ```sh blocks and checks every other one without
# running it: the ci, manual and from= rules above, `bash -n` or a parse for the rest.
#
# Where: each page runs in a scratch folder of its own (mktemp -d), its commands in order, so a
# command may use what the page's earlier commands wrote (never another page's). The folder
# holds links to the repository's `fixtures` and `target` folders, so `fixtures/...` paths work,
# and every output lands in the scratch folder: the repository stays clean.
#
# Which autopar: `autopar ARGS` and `cargo run --release -- ARGS` run the binary under test,
# $AUTOPAR_BIN, or else target/release/autopar built here once (`cargo build --release`). A
# page's own `cargo build --release [--features mpi]` stands for that build (the binary must be
# that kind, MPI or not). Other cargo commands run in the repository root. In --mpi runs
# OpenMPI is told, through its environment, to allow root and more ranks than cores, and to
# skip the single-copy mechanism that containers lack, as `autopar launch` does.
#
# Usage: .ci/doc-commands.sh [--mpi | --python] [--manual] [--no-build] [FILE...]
#   --mpi        run the ```sh mpi blocks (needs AUTOPAR_BIN, an MPI build, and mpirun)
#   --python     run the ```python and ```sh python blocks (the package installed)
#   --manual     also run the ```sh manual blocks
#   --no-build   run no cargo at all: AUTOPAR_BIN must be given, and commands that would
#                call cargo for anything else are listed as skipped
#   FILE...      these pages only (default: README.md and docs/*.md)
# Environment: AUTOPAR_BIN (the binary), DOC_TIMEOUT (seconds per command, default 600).
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"

stage=default manual=0 nobuild=0 pages=()
while [ $# -gt 0 ]; do
    case "$1" in
        --mpi) stage=mpi ;;
        --python) stage=python ;;
        --manual) manual=1 ;;
        --no-build) nobuild=1 ;;
        -h | --help) sed -n '2,47p' "$0"; exit 0 ;;
        -*) echo "doc-commands: unknown option $1 (see --help)" >&2; exit 2 ;;
        *) pages+=("$1") ;;
    esac
    shift
done
if [ ${#pages[@]} -eq 0 ]; then
    pages=(README.md)
    for f in docs/*.md; do [ -e "$f" ] && pages+=("$f"); done
fi
limit=${DOC_TIMEOUT:-600}
target_dir=${CARGO_TARGET_DIR:-target}
case "$target_dir" in /*) ;; *) target_dir="$repo/$target_dir" ;; esac

root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
tools="$root/.tools"
mkdir -p "$tools/bin"

# The binary under test, on PATH as `autopar` (also for mpirun and `autopar launch`).
need_bin=1
[ "$stage" = python ] && need_bin=0
if [ "$need_bin" = 1 ]; then
    if [ -z "${AUTOPAR_BIN:-}" ]; then
        if [ "$nobuild" = 1 ] || [ "$stage" = mpi ]; then
            echo "doc-commands: --no-build and --mpi need AUTOPAR_BIN, the autopar binary to run (for --mpi, an MPI build)" >&2
            exit 2
        fi
        echo "doc-commands: cargo build --release"
        cargo build --release || exit 1
        AUTOPAR_BIN="$target_dir/release/autopar"
    fi
    case "$AUTOPAR_BIN" in /*) ;; *) AUTOPAR_BIN="$PWD/$AUTOPAR_BIN" ;; esac
    if ! [ -x "$AUTOPAR_BIN" ]; then
        echo "doc-commands: AUTOPAR_BIN=$AUTOPAR_BIN is not an executable" >&2
        exit 2
    fi
    ln -s "$AUTOPAR_BIN" "$tools/bin/autopar"
    echo "doc-commands: autopar is $AUTOPAR_BIN ($("$AUTOPAR_BIN" --version))"
fi
export AUTOPAR_BIN DOC_REPO="$repo" DOC_TOOLS="$tools" DOC_NO_CARGO="$nobuild"
export PATH="$tools/bin:$PATH" AUTOPAR_PROGRESS=0
if [ "$stage" = mpi ]; then
    export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
    if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
fi

# What every command's bash reads first: `cargo run --release -- ARGS` is the binary under
# test, `cargo build --release [--features mpi]` that build, other cargo runs in the repository.
cat >"$tools/prelude.sh" <<'PRELUDE'
set -o pipefail
cargo() {
    if [ "${1-}" = run ] && [ "${2-}" = --release ] && [ "${3-}" = -- ]; then
        shift 3
        autopar "$@"
        return
    fi
    local want=""
    case "$*" in
        "build --release") want="(no mpi)" ;;
        "build --release --features mpi") want="(mpi)" ;;
    esac
    if [ -n "$want" ]; then
        if ! autopar --version | grep -qF "$want"; then
            echo "doc-commands: the page builds autopar $want, but the binary under test is $(autopar --version)" >&2
            return 1
        fi
        return 0
    fi
    if [ "$DOC_NO_CARGO" = 1 ]; then
        echo "cargo $*" >"$DOC_TOOLS/skipped"
        exit 97
    fi
    (cd "$DOC_REPO" && command cargo "$@")
}
PRELUDE

ci_lines=$(cat .ci/run .ci/*.sh | sed -E 's/^[[:space:]]+//; s/[[:space:]]+$//')
failures=()
ran=0 checked=0 skipped=() started=$(date +%s)

fail() { # page line message [log]
    failures+=("$1:$2: $3")
    echo "doc-commands: FAILED $1:$2: $3" >&2
    if [ -n "${4:-}" ] && [ -s "$4" ]; then tail -n 40 "$4" | sed 's/^/    /' >&2; fi
}

# One command of a page, in the page's scratch folder.
run_command() { # page line command dir
    local page=$1 line=$2 cmd=$3 dir=$4 log="$tools/log" rc=0 t0 t1
    rm -f "$tools/skipped"
    { cat "$tools/prelude.sh"; printf '%s\n' "$cmd"; } >"$tools/command.sh"
    echo "doc-commands: $page:$line: $(head -n 1 <<<"$cmd")$([ "$(wc -l <<<"$cmd")" -gt 1 ] && echo ' ...')"
    t0=$(date +%s.%N)
    (cd "$dir" && timeout "$limit" bash "$tools/command.sh" </dev/null >"$log" 2>&1) || rc=$?
    t1=$(date +%s.%N)
    if [ -e "$tools/skipped" ]; then
        skipped+=("$page:$line: $(cat "$tools/skipped") (--no-build)")
        echo "    skipped: it runs $(cat "$tools/skipped")"
        return
    fi
    ran=$((ran + 1))
    if [ "$rc" = 124 ]; then
        fail "$page" "$line" "timed out after ${limit} s: $cmd" "$log"
    elif [ "$rc" != 0 ]; then
        fail "$page" "$line" "exit code $rc: $cmd" "$log"
    else
        awk -v a="$t0" -v b="$t1" 'BEGIN { printf "    ok, %.1f s\n", b - a }'
    fi
}

# A ```python block: one program, padded so that its line numbers are the page's.
run_python() { # page first-line text dir
    local page=$1 first=$2 text=$3 dir=$4 file="$tools/$1.py" rc=0 i
    mkdir -p "$(dirname "$file")"
    { for ((i = 1; i < first; i++)); do echo; done; printf '%s\n' "$text"; } >"$file"
    echo "doc-commands: $page:$first: a python block ($(wc -l <<<"$text") lines)"
    (cd "$dir" && timeout "$limit" python3 "$file" </dev/null >"$tools/log" 2>&1) || rc=$?
    ran=$((ran + 1))
    if [ "$rc" != 0 ]; then fail "$page" "$first" "the python block exits with $rc (its traceback names $file)" "$tools/log"; else echo "    ok"; fi
}

# `bash -n`, and every cargo package, bench, example and .ci script the command names exists.
check_manual() { # page line command
    local page=$1 line=$2 cmd=$3 pkg=autopar w prev="" words
    if ! bash -n <<<"$cmd" 2>"$tools/log"; then fail "$page" "$line" "not valid bash: $cmd" "$tools/log"; return; fi
    read -r -a words <<<"$(tr '\\\n' '  ' <<<"$cmd")"
    for w in "${words[@]}"; do
        case "$prev" in
            -p) pkg=$w; [ -f "crates/$w/Cargo.toml" ] || fail "$page" "$line" "no package $w (crates/$w): $cmd" ;;
        esac
        prev=$w
    done
    prev=""
    for w in "${words[@]}"; do
        case "$prev" in
            --bench) [ -f "crates/$pkg/benches/$w.rs" ] || fail "$page" "$line" "no bench $w in crates/$pkg/benches: $cmd" ;;
            --example) [ -f "crates/$pkg/examples/$w.rs" ] || fail "$page" "$line" "no example $w in crates/$pkg/examples: $cmd" ;;
        esac
        case "$w" in .ci/*) [ -f "$w" ] || fail "$page" "$line" "no script $w: $cmd" ;; esac
        prev=$w
    done
    checked=$((checked + 1))
}

check_ci() { # page line command
    local cmd
    cmd=$(tr -s ' \t' '  ' <<<"$3" | sed -E 's/^ //; s/ $//')
    if grep -qxF -- "$cmd" <<<"$ci_lines"; then
        checked=$((checked + 1))
    else
        fail "$1" "$2" "shown as what CI runs, but no line of .ci/run or .ci/*.sh is: $cmd"
    fi
}

check_excerpt() { # page line path text
    local page=$1 line=$2 path=$3 text=$4
    if ! [ -f "$path" ]; then fail "$page" "$line" "the excerpt's file $path does not exist"; return; fi
    # The excerpt's lines, in order and together, somewhere in the file.
    if ! awk -v want="$text" 'BEGIN { n = split(want, w, "\n") }
        { f[NR] = $0 }
        END { for (s = 1; s + n - 1 <= NR; s++) { ok = 1; for (i = 1; i <= n; i++) if (f[s + i - 1] != w[i]) { ok = 0; break } if (ok) exit 0 } exit 1 }' "$path"; then
        fail "$page" "$line" "this excerpt is no longer in $path (copy it again from the file)"
        return
    fi
    checked=$((checked + 1))
}

# Walk a page: every fenced block, by its info string.
do_page() { # page
    local page=$1 dir n=0 in=0 lang="" tags="" indent="" first=0 block=() cmd="" cmd_line=0 line raw run i k
    if ! [ -f "$page" ]; then fail "$page" 0 "no such page"; return; fi
    dir="$root/$(tr '/' '_' <<<"$page")"
    mkdir -p "$dir"
    ln -s "$repo/fixtures" "$dir/fixtures"
    ln -s "$target_dir" "$dir/target"
    local commands=() lines=() kinds=()
    while IFS= read -r raw || [ -n "$raw" ]; do
        n=$((n + 1))
        if [ "$in" = 0 ]; then
            if [[ "$raw" =~ ^([[:space:]]*)\`\`\`([^\`]*)$ ]]; then
                in=1 indent=${BASH_REMATCH[1]} first=$((n + 1)) block=()
                read -r lang tags <<<"${BASH_REMATCH[2]}"
            fi
            continue
        fi
        if [[ "$raw" =~ ^[[:space:]]*\`\`\`[[:space:]]*$ ]]; then
            in=0
            if [[ "$tags" == file=* ]]; then
                commands+=("$(printf '%s\n' "${block[@]}")") lines+=("$first") kinds+=("$tags")
                continue
            fi
            case "$lang" in
                bash | shell | console) fail "$page" "$((first - 1))" "a \`\`\`$lang block: write \`\`\`sh (commands) or \`\`\`text (output)" ;;
                python) commands+=("$(printf '%s\n' "${block[@]}")") lines+=("$first") kinds+=(pyblock) ;;
                rust)
                    case "$tags" in
                        from=*) if [ "$stage" = default ]; then check_excerpt "$page" "$first" "${tags#from=}" "$(printf '%s\n' "${block[@]}")"; fi ;;
                    esac
                    ;;
                sh)
                    case "$tags" in
                        "" | mpi | python | ci | manual) ;;
                        *) fail "$page" "$((first - 1))" "unknown tag \"$tags\" after \`\`\`sh (see .ci/doc-commands.sh)"; continue ;;
                    esac
                    # Commands: `\` continues a line; blank lines and comments are skipped.
                    cmd="" cmd_line=0
                    for ((i = 0; i < ${#block[@]}; i++)); do
                        line=${block[$i]}
                        if [ -z "$cmd" ]; then
                            [[ "$line" =~ ^[[:space:]]*(#|$) ]] && continue
                            cmd_line=$((first + i))
                            line=${line#"${line%%[![:space:]]*}"}
                            cmd=$line
                        else
                            cmd+=$'\n'$line
                        fi
                        if [[ "$line" == *\\ ]]; then continue; fi
                        commands+=("$cmd") lines+=("$cmd_line") kinds+=("${tags:-run}")
                        cmd=""
                    done
                    [ -n "$cmd" ] && fail "$page" "$cmd_line" "the last line ends in \\ and nothing follows"
                    ;;
            esac
            continue
        fi
        block+=("${raw#"$indent"}")
    done <"$page"
    [ "$in" = 1 ] && fail "$page" "$((first - 1))" "a code block is never closed"

    for ((k = 0; k < ${#commands[@]}; k++)); do
        run=0
        case "${kinds[$k]}:$stage" in
            file=*)
                local name=${kinds[$k]#file=}
                name=${name%%:*}
                mkdir -p "$(dirname "$dir/$name")" && printf '%s\n' "${commands[$k]}" >"$dir/$name"
                ;;
            run:default | mpi:mpi | python:python) run=1 ;;
            pyblock:python) run_python "$page" "${lines[$k]}" "${commands[$k]}" "$dir" ;;
            pyblock:default)
                if ! command -v python3 >/dev/null; then
                    :
                elif { for ((i = 1; i < ${lines[$k]}; i++)); do echo; done; printf '%s\n' "${commands[$k]}"; } |
                    python3 -c 'import sys; compile(sys.stdin.read(), sys.argv[1], "exec")' "$page" 2>"$tools/log"; then
                    checked=$((checked + 1))
                else
                    fail "$page" "${lines[$k]}" "the python block does not parse" "$tools/log"
                fi
                ;;
            manual:default) if [ "$manual" = 1 ]; then run=1; else check_manual "$page" "${lines[$k]}" "${commands[$k]}"; fi ;;
            ci:default) check_ci "$page" "${lines[$k]}" "${commands[$k]}" ;;
            *:default)
                if bash -n <<<"${commands[$k]}" 2>"$tools/log"; then checked=$((checked + 1)); else fail "$page" "${lines[$k]}" "not valid bash: ${commands[$k]}" "$tools/log"; fi
                ;;
        esac
        [ "$run" = 1 ] && run_command "$page" "${lines[$k]}" "${commands[$k]}" "$dir"
    done
}

for page in "${pages[@]}"; do
    do_page "$page"
done

echo "doc-commands: $ran command(s) run, $checked checked without running, ${#skipped[@]} skipped, ${#failures[@]} failed ($(($(date +%s) - started)) s)"
for s in "${skipped[@]}"; do echo "  skipped $s"; done
for f in "${failures[@]}"; do echo "  FAILED $f" >&2; done
[ ${#failures[@]} = 0 ]
