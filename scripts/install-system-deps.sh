#!/usr/bin/env bash
# Debian packages flagtrial's build and tests need; installs only what is missing.
set -euo pipefail
need=()
# systemd: its own unit parser checks our ExecStart quoting (tests); util-linux: setpriv, flock.
# nginx: the load client's tests and benchmark stream pre-rendered SSE from it.
for pkg in python3 python3-venv python3-dev cmake g++ make git libgomp1 curl iproute2 systemd util-linux nginx-light; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || need+=("$pkg")
done
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
  echo "missing Debian packages: ${need[*]} (run as root: apt-get install -y ${need[*]})" >&2
  exit 1
fi
apt-get update -qq
# No service may start on install (nginx would listen on port 80): tests start their own.
policy=/usr/sbin/policy-rc.d
[ -e "$policy" ] || { printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy" && trap 'rm -f "$policy"' EXIT; }
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}"
