#!/usr/bin/env bash
# The registry tests (tests/test_dist_*.py) run Debian's docker-registry (distribution 2.8) and
# skopeo. Installs them with apt when missing; elsewhere says what to install (those tests then
# skip with one line). Called by `make test`'s dev set-up.
set -u
if command -v docker-registry >/dev/null 2>&1 && command -v skopeo >/dev/null 2>&1; then
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "note: no apt-get here: install docker-registry (CNCF distribution 2.x) and skopeo to run the registry tests"
    exit 0
fi
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq docker-registry skopeo \
    || echo "note: apt-get could not install docker-registry and skopeo; the registry tests will skip"
# the package's own service is not needed (tests start their own on a free loopback port)
exit 0
