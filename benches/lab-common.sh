# Shared by the CNI-lab benchmarks (benches/workload.sh, benches/soak.sh); sourced, not run.

# install_missing CMD:PACKAGE...: installs, from Debian, the packages whose command is missing,
# and the CNI plugins the two-node lab is made with.
install_missing() {
  local need=() t
  for t in "$@"; do
    command -v "${t%%:*}" >/dev/null || need+=("${t#*:}")
  done
  [ -x /usr/lib/cni/ptp ] && [ -x /usr/lib/cni/bridge ] || need+=(containernetworking-plugins)
  [ ${#need[@]} -gt 0 ] || return 0
  echo "== installing ${need[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${need[@]}" >/dev/null ||
    { apt-get update -q >/dev/null &&
      DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${need[@]}" >/dev/null; }
}

# release_binary: KXDP_BIN, or a release build of kxdp exported as KXDP_BIN.
release_binary() {
  if [ -z "${KXDP_BIN:-}" ]; then
    echo "== build (release kxdp)"
    cargo build --release --locked --bin kxdp
    export KXDP_BIN=$PWD/target/release/kxdp
  fi
}
