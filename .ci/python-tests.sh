#!/usr/bin/env bash
# The Python package: build and install it with the command of docs/python.md into a fresh
# virtual environment, run its pytest suite against MindSpore's committed files, then the
# Python examples of the documentation (.ci/doc-commands.sh --python).
set -euo pipefail
cd "$(dirname "$0")/.."

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }
if ! python3 -c 'import venv, ensurepip' >/dev/null 2>&1; then
    echo "python-tests: installing python3-venv"
    as_root apt-get update -qq
    DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq python3-venv python3-pip
fi

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
python3 -m venv "$scratch/venv"
export PATH="$scratch/venv/bin:$PATH"
python3 -m pip install -q --upgrade pip
# The commands docs/python.md shows (as ```sh ci: this script runs them word for word).
echo "python-tests: pip install ./crates/autopar-py[test]"
pip install "./crates/autopar-py[test]"
pytest crates/autopar-py/tests
echo "python-tests: the documentation's Python examples"
bash .ci/doc-commands.sh --python
