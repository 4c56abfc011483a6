#!/usr/bin/env bash
# Runs a kxdp binary in an empty root (only the binary, the example inputs, /proc for its own
# process metrics): what the `FROM scratch` image of deploy/Dockerfile offers. Fails if the
# binary is dynamically linked or needs anything from the filesystem. Needs root (chroot).
set -Eeuo pipefail
bin=${1:?usage: static-check.sh KXDP_BINARY}
cd "$(dirname "$0")/.."
if readelf -l "$bin" | grep -q 'Requesting program interpreter'; then
  echo "static-check: $bin is dynamically linked" >&2
  exit 1
fi
root=$(mktemp -d /tmp/kxdp-static.XXXXXX)
trap 'rm -rf "$root"' EXIT
install -D -m 0755 "$bin" "$root/usr/local/bin/kxdp"
cp -r examples "$root/examples"
cp pcaps/example.pcap "$root/example.pcap"
chroot "$root" /usr/local/bin/kxdp version
chroot "$root" /usr/local/bin/kxdp replay --config /examples/config.yaml --state /examples/cluster \
  --pcap /example.pcap --json > "$root/summary.json"
grep -q '"packets"' "$root/summary.json"
echo "static-check: $bin runs in an empty root"
