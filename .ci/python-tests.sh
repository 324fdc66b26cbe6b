#!/usr/bin/env bash
# The Python package: build and install it with the README's command into a fresh virtual
# environment, then run its pytest suite against MindSpore's committed files.
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
py="$scratch/venv/bin/python"
"$py" -m pip install -q --upgrade pip
echo "python-tests: pip install ./crates/autopar-py[test]"
"$py" -m pip install -q "./crates/autopar-py[test]"
"$py" -m pytest -q crates/autopar-py/tests
