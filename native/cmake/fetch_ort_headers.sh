#!/usr/bin/env bash
# Fetch ONNX Runtime's C and plugin-EP headers from Debian's libonnxruntime-dev into a private directory.
#
# Usage: fetch_ort_headers.sh DEST
# Writes DEST/usr/include/onnxruntime/*.h and prints that include directory on stdout. Uses a private apt
# state (sources list, lists, cache under DEST/apt) naming Debian's `sid` and `experimental` suites on the
# mirror the machine's own apt sources use; nothing is installed system-wide and nothing is cached outside
# DEST. Exits non-zero with one line on stderr when the headers cannot be fetched.
set -euo pipefail
dest=${1:?usage: fetch_ort_headers.sh DEST}
fail() { echo "ndp-ep: cannot fetch the ONNX Runtime headers: $*; set ORT_INCLUDE_DIR to a directory with onnxruntime_ep_c_api.h" >&2; exit 1; }

command -v apt-get >/dev/null 2>&1 || fail "apt-get is not available"
command -v dpkg-deb >/dev/null 2>&1 || fail "dpkg-deb is not available"

# The Debian mirror of the machine's apt sources (deb822 .sources files or one-line .list files).
mirror=""
for file in /etc/apt/sources.list.d/*.sources /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
  [ -r "$file" ] || continue
  case "$file" in
    *.sources) candidates=$(awk 'tolower($1)=="uris:" {for (i=2;i<=NF;i++) print $i}' "$file") ;;
    *) candidates=$(awk '$1=="deb" {for (i=2;i<=NF;i++) if ($i ~ /:\/\//) {print $i; break}}' "$file") ;;
  esac
  for uri in $candidates; do
    uri=${uri%/}
    case "$uri" in
      *debian-security*|*security.debian*) continue ;;
      */debian) mirror=$uri; break 2 ;;
    esac
  done
done
[ -n "$mirror" ] || fail "no Debian mirror found in /etc/apt/sources*"
keyring=/usr/share/keyrings/debian-archive-keyring.gpg
[ -r "$keyring" ] || fail "$keyring is missing"

state="$dest/apt"
mkdir -p "$state/lists/partial" "$state/cache/archives/partial" "$state/etc"
printf 'deb [signed-by=%s] %s sid main\ndeb [signed-by=%s] %s experimental main\n' \
  "$keyring" "$mirror" "$keyring" "$mirror" >"$state/etc/sources.list"
apt_opts=(
  -o "Dir::Etc::sourcelist=$state/etc/sources.list" -o "Dir::Etc::sourceparts=/nonexistent"
  -o "Dir::State::Lists=$state/lists" -o "Dir::Cache=$state/cache" -o "Dir::State::status=/dev/null"
  -o "APT::Sandbox::User=root" -o "Debug::NoLocking=1" -o "Acquire::Languages=none"
  -o "Acquire::IndexTargets::deb::Contents-deb::DefaultEnabled=false"
)
apt-get -qq "${apt_opts[@]}" update >"$state/update.log" 2>&1 || fail "apt-get update failed (see $state/update.log)"
version=$(apt-cache "${apt_opts[@]}" madison libonnxruntime-dev 2>/dev/null | awk -F'|' '{gsub(/ /,"",$2); print $2}' \
  | sort -V | tail -n 1)
[ -n "$version" ] || fail "libonnxruntime-dev is not in sid/experimental on $mirror"
(cd "$state" && apt-get -qq "${apt_opts[@]}" download "libonnxruntime-dev=$version" >"$state/download.log" 2>&1) \
  || fail "apt-get download libonnxruntime-dev=$version failed (see $state/download.log)"
deb=$(ls "$state"/libonnxruntime-dev_*.deb 2>/dev/null | head -n 1)
[ -n "$deb" ] || fail "the downloaded package is missing"
dpkg-deb -x "$deb" "$dest" || fail "dpkg-deb -x $deb failed"
include="$dest/usr/include/onnxruntime"
[ -f "$include/onnxruntime_ep_c_api.h" ] || fail "libonnxruntime-dev $version has no onnxruntime_ep_c_api.h"
echo "$include"
