#!/usr/bin/env bash
# Installs every build, test and interop dependency of sluice from Debian packages.
# Idempotent: when everything is present it does nothing (no apt-get update, no network).
set -euo pipefail

PKGS=(
  # toolchain
  build-essential cmake pkg-config git
  # libraries (pkg-config names in CMakeLists.txt)
  libevent-dev libprotobuf-c-dev protobuf-c-compiler libsnappy-dev libsqlite3-dev
  libcmocka-dev libre2-dev libyaml-dev libxxhash-dev zlib1g-dev libjansson-dev libdouble-conversion-dev
  # io_uring: one system call for a flow-control change's 1,000 answers (internal/net/fanout)
  liburing-dev
  # TLS (OpenSSL; libevent-dev brings libevent_openssl) and bcrypt for basic auth (libxcrypt)
  libssl-dev libcrypt-dev
  # fuzzing (make fuzz, ctest fuzz/short): clang and its libFuzzer/sanitizer runtimes
  clang libclang-rt-14-dev
  # tests and tools
  python3 python3-pytest python3-requests python3-prometheus-client python3-snappy curl sqlite3 procps
  # test_tls.py: bcrypt hashes made by an implementation other than sluice's; the openssl CLI
  python3-bcrypt openssl
  # test_deploy.py: systemd-analyze verify of deploy/systemd/sluice.service; PyYAML for the manifests
  systemd python3-yaml
  # the dashboard's browser test (tests/integration/test_dashboard_browser.py): Debian's chromium
  # driven by playwright-core, which the test installs from tests/browser/package-lock.json (npm ci)
  chromium
  # real peers the integration tests and benchmarks start
  prometheus prometheus-pushgateway victoria-metrics prometheus-alertmanager
)
# node and npm for that test. Only when the commands are missing: a nodejs from elsewhere (e.g.
# NodeSource's, which bundles npm and conflicts with Debian's npm package) is left alone.
command -v node >/dev/null 2>&1 || PKGS+=(nodejs)
command -v npm >/dev/null 2>&1 || PKGS+=(npm)

missing=()
for p in "${PKGS[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "install-deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
# Debian's packages of the peers ship services that would start and take :9090/:9091 on a
# machine with an init system; the tests start their own instances, so keep them stopped.
policy=/usr/sbin/policy-rc.d
made_policy=0
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$policy" >/dev/null
  $SUDO chmod +x "$policy"
  made_policy=1
fi
rc=0
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}" </dev/null || rc=$?
if [ "$made_policy" = 1 ]; then $SUDO rm -f "$policy"; fi
exit $rc
