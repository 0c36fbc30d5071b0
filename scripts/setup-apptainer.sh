#!/usr/bin/env bash
# setup-apptainer.sh - Apptainer on Debian 12 (bookworm has no package): Debian unstable's apptainer, from the
# same mirror apt uses, unpacked under DEST with a newer glibc beside it and relocated onto it with patchelf.
# Idempotent. Also adds the subuid/subgid range that `apptainer build --fakeroot` needs for root.
# Usage: scripts/setup-apptainer.sh [DEST]   (default /opt/distrain-apptainer; result DEST/bin/apptainer,
#        DEST/bin/singularity for spython). Needs: patchelf squashfs-tools uidmap (install.sh installs them).
set -euo pipefail
DEST=${1:-${DISTRAIN_APPTAINER_HOME:-/opt/distrain-apptainer}}
if command -v apptainer >/dev/null 2>&1 && [ "$(command -v apptainer)" != "$DEST/bin/apptainer" ]; then
  echo "setup-apptainer.sh: using the installed $(apptainer --version)"; exit 0
fi
ensure_subid() { grep -q '^root:' "$1" 2>/dev/null || echo 'root:100000:65536' >> "$1"; }
if [ "$(id -u)" = 0 ]; then ensure_subid /etc/subuid; ensure_subid /etc/subgid; fi
if "$DEST/bin/apptainer" --version >/dev/null 2>&1; then
  echo "setup-apptainer.sh: $("$DEST/bin/apptainer" --version) at $DEST"; exit 0
fi
MIRROR=$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
[ -n "$MIRROR" ] || MIRROR=$(awk '/^deb /{print $2; exit}' /etc/apt/sources.list)
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
mkdir -p "$W/lists/partial" "$DEST"
echo "deb $MIRROR sid main" > "$W/sources.list"
O=(-o Dir::Etc::SourceList="$W/sources.list" -o Dir::Etc::SourceParts=/dev/null -o Dir::State::Lists="$W/lists"
   -o Dir::Cache::pkgcache="$W/pkgcache.bin" -o Dir::Cache::srcpkgcache="$W/srcpkgcache.bin")
apt-get "${O[@]}" -qq update
( cd "$W" && apt-get "${O[@]}" -qq download apptainer libc6 )
rm -rf "$DEST/root" "$DEST/glibc"
dpkg-deb -x "$W"/apptainer_*.deb "$DEST/root"
dpkg-deb -x "$W"/libc6_*.deb "$DEST/glibc"
L="$DEST/glibc/usr/lib/x86_64-linux-gnu"
for b in "$DEST/root/usr/bin/apptainer" "$DEST/root/usr/lib/x86_64-linux-gnu/apptainer/bin/starter"; do
  patchelf --set-interpreter "$L/ld-linux-x86-64.so.2" --force-rpath --set-rpath "$L:/usr/lib/x86_64-linux-gnu" "$b"
done
R="$DEST/root/usr"
# relocation quirks: sysconfdir -> <prefix>/etc, capability.json -> <prefix>/lib/etc, sessiondir under <prefix>/lib/var
mkdir -p "$R/etc" "$R/lib/var/lib/apptainer/mnt/session"
cp -a "$DEST/root/etc/apptainer" "$R/etc/"
ln -sfn ../etc "$R/lib/etc"
mkdir -p "$DEST/bin"
ln -sf "$R/bin/apptainer" "$DEST/bin/apptainer"
ln -sf "$R/bin/apptainer" "$DEST/bin/singularity"   # spython only knows this name
echo "setup-apptainer.sh: $("$DEST/bin/apptainer" --version) at $DEST"
