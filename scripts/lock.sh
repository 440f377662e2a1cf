#!/usr/bin/env bash
# Regenerates requirements.lock, the hashed lock `make test` and `make demo` install from:
# every extra of pyproject.toml but `bench` (build-backend's setuptools too: --allow-unsafe),
# each pin with its PyPI hashes. Versions already in the lock are kept; pass
# --upgrade-package NAME (or --upgrade) to move one. Needs network to PyPI.
set -euo pipefail
cd "$(dirname "$0")/.."
tools=$(mktemp -d)
trap 'rm -rf "$tools"' EXIT
python3.11 -m venv "$tools"
"$tools/bin/pip" install --quiet --disable-pip-version-check pip-tools==7.6.2
# Every extra but `bench` (what the benchmarks run beside ours, e.g. vllm-router: installed by
# hand, never by `make test` or a deployment).
extras=$(python3.11 -c 'import tomllib
extras = tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]
print(" ".join(f"--extra {name}" for name in extras if name != "bench"))')
# shellcheck disable=SC2086  # one word per flag
"$tools/bin/pip-compile" --quiet --generate-hashes $extras --strip-extras --allow-unsafe \
  --no-emit-index-url --no-emit-find-links -o requirements.lock "$@" pyproject.toml
# The project itself is installed editable, apart from the lock: drop its self-reference.
"$tools/bin/python" scripts/lock_strip_self.py requirements.lock
