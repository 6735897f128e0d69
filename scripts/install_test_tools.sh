#!/usr/bin/env bash
# The system tools some tests run, from Debian's packages: docker-registry (distribution 2.8) and
# skopeo for the registry tests (tests/distribution/), qemu-user's qemu-x86_64 for the CPU
# variants' smoke tests on emulated older CPUs (tests/unit/test_cpu_variants.py). Installs them
# with apt when missing; elsewhere says what to install (those tests then skip with one line).
# Called by `make test`'s dev set-up.
set -u
missing=""
command -v docker-registry >/dev/null 2>&1 || missing="$missing docker-registry"
command -v skopeo >/dev/null 2>&1 || missing="$missing skopeo"
command -v qemu-x86_64 >/dev/null 2>&1 || missing="$missing qemu-user"
if [ -z "$missing" ]; then
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "note: no apt-get here: install$missing to run the registry and emulated-CPU tests"
    exit 0
fi
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
# shellcheck disable=SC2086  # (the package names, one word each)
$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing \
    || echo "note: apt-get could not install$missing; the tests that need them will skip"
# docker-registry's own service is not needed (tests start their own on a free loopback port)
exit 0
