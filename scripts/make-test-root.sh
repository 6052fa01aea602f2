#!/usr/bin/env bash
# Build the Debian bookworm root that tests boot with systemd-nspawn as a real systemd host,
# and the ssh keypair the tests log in with. Cached under ~/.cache/flagtrial/; built once.
# Prints the root's path. Needs root (debootstrap, and the tests' nspawn).
set -euo pipefail
CACHE="${FLAGTRIAL_CACHE:-$HOME/.cache/flagtrial}"
ROOT="$CACHE/nspawn-root-v1"
KEYDIR="$CACHE/test-ssh"
MIRROR="${FLAGTRIAL_DEBIAN_MIRROR:-http://deb.debian.org/debian}"

if [ "$(id -u)" -ne 0 ]; then
  echo "make-test-root.sh must run as root (debootstrap, systemd-nspawn)" >&2
  exit 1
fi

# openssh-client for ssh-keygen: no sshd is needed (or started) on this machine.
need=()
for pkg in systemd-container debootstrap openssh-client iproute2 util-linux; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
  apt-get -o DPkg::Lock::Timeout=300 update -qq
  DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y -qq \
    --no-install-recommends "${need[@]}" >&2
fi
mkdir -p "$CACHE"
# One build at a time: a second caller waits, then finds the root built.
exec 9>"$CACHE/nspawn-root.lock"
flock 9

# The keypair: made in a temp folder and renamed, so a killed run never leaves half a pair.
if [ ! -f "$KEYDIR/id_ed25519.pub" ]; then
  tmpkeys="$(mktemp -d "$CACHE/test-ssh.tmp-XXXXXX")"
  ssh-keygen -q -t ed25519 -N '' -C flagtrial-test -f "$tmpkeys/id_ed25519"
  chmod 700 "$tmpkeys"
  rm -rf "$KEYDIR"
  mv "$tmpkeys" "$KEYDIR"
fi

if [ -d "$ROOT" ]; then
  # A key made anew (its folder was deleted) must still open the cached root.
  cmp -s "$KEYDIR/id_ed25519.pub" "$ROOT/root/.ssh/authorized_keys" ||
    install -m 600 "$KEYDIR/id_ed25519.pub" "$ROOT/root/.ssh/authorized_keys"
  echo "$ROOT"
  exit 0
fi

# Built beside the final path and renamed at the end: a killed build never leaves a half root.
rm -rf "$CACHE"/nspawn-root-v1.build-*  # what a killed build left (we hold the lock)
BUILD="$(mktemp -d "$CACHE/nspawn-root-v1.build-XXXXXX")"
trap 'rm -rf "$BUILD"' EXIT
debootstrap --variant=minbase \
  --include=systemd,systemd-sysv,dbus,openssh-server,iproute2,libgomp1,curl,ca-certificates,util-linux \
  bookworm "$BUILD" "$MIRROR" >&2

# nspawn -M sets the hostname only when the root has none of its own.
rm -f "$BUILD/etc/hostname"
install -d -m 700 "$BUILD/root/.ssh"
install -m 600 "$KEYDIR/id_ed25519.pub" "$BUILD/root/.ssh/authorized_keys"
cat >"$BUILD/etc/ssh/sshd_config.d/flagtrial-test.conf" <<'EOF'
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UseDNS no
EOF
# Timers that would wake apt or fsck jobs in a test container only cost CPU: mask them.
for unit in apt-daily.timer apt-daily-upgrade.timer e2scrub_all.timer fstrim.timer \
  systemd-tmpfiles-clean.timer dpkg-db-backup.timer; do
  ln -sf /dev/null "$BUILD/etc/systemd/system/$unit"
done
chmod 755 "$BUILD"
mv "$BUILD" "$ROOT"
trap - EXIT
echo "$ROOT"
