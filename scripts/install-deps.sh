#!/usr/bin/env bash
# Installs the Debian packages accel needs to build and test, and only those missing.
# Run as root (or with sudo available). Safe to run repeatedly: does nothing when all is present.
set -eu
pkgs=(build-essential cmake pkg-config libopenblas-dev libyaml-dev libjansson-dev libxxhash-dev
      libopenmpi-dev openmpi-bin libgloo-dev procps python3 python3-venv
      libboost-context-dev) # boost-context: the CUDA emulator build's fibers (tests/cuemu)
missing=()
for p in "${pkgs[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
        missing+=("$p")
    fi
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "install-deps: installing ${missing[*]}"
sudo=""
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then sudo="sudo"; else
        echo "install-deps: missing packages (${missing[*]}) and not root; run: apt-get install ${missing[*]}" >&2
        exit 1
    fi
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
