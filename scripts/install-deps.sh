#!/usr/bin/env bash
# Installs the Debian packages the build and tests need, only those missing. Idempotent.
set -euo pipefail
pkgs=(cmake ninja-build g++ clang libclang-rt-14-dev libgtest-dev libgmock-dev libbenchmark-dev nlohmann-json3-dev libcli11-dev
      openmpi-bin libopenmpi-dev  # Open MPI: expert parallelism (--ep) and its mpirun tests
      pybind11-dev python3-dev python3-numpy python3-pytest python3-torch)  # the Python module and its tests
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if ((${#missing[@]})); then
  echo "installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${missing[@]}" >/dev/null
fi
