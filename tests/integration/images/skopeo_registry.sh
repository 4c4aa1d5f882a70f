#!/usr/bin/env bash
# Integration test for actors/images with real tools (fails loudly if one is missing):
#  - build a busybox image; skopeo reads our store as an OCI layout and writes gzip and zstd
#    layouts, an oci-archive and a docker-archive; each imports, verifies, and its prepared
#    rootfs equals the source tree and runs busybox under chroot;
#  - a corrupted and a truncated docker-archive are refused, the store unchanged;
#  - pull by digest from Debian's docker-registry on loopback (directly and through a mirror
#    map); a wrong digest and a tag-only reference are refused, the store unchanged;
#  - deploy/build-guest-image.sh is deterministic and puts the guest at /run/kagent/guest;
#  - a prepared rootfs works as an overlayfs lower layer and is never written through; rm refuses
#    an image mounted in any mount namespace, and otherwise removes all it alone used.
set -euo pipefail

build=${KAGENT_BUILD_DIR:?KAGENT_BUILD_DIR must be set}
src=${KAGENT_SOURCE_DIR:?KAGENT_SOURCE_DIR must be set}
tool=$build/actors/images/kagent-image
fail() { echo "FAIL: $*" >&2; exit 1; }
for t in skopeo docker-registry chroot curl tar; do
  command -v "$t" >/dev/null || fail "$t is not installed (deploy/install-deps.sh)"
done
[ -x /bin/busybox ] || fail "/bin/busybox missing (busybox-static)"
[ -x "$tool" ] || fail "$tool missing"

work=$(mktemp -d "${TMPDIR:-/tmp}/ka-images-it.XXXXXX")
reg_pid=
merged=
ns_pid=
cleanup() { # teardown only (EXIT): each may be gone already; the registry's status is checked where it matters
  if [ -n "$merged" ]; then umount "$merged" 2>/dev/null || true; fi
  if [ -n "$ns_pid" ]; then kill "$ns_pid" 2>/dev/null || true; wait "$ns_pid" 2>/dev/null || true; fi
  if [ -n "$reg_pid" ]; then kill "$reg_pid" 2>/dev/null || true; wait "$reg_pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT
export KAGENT_STATE_DIR= # the tool gets --state-dir explicitly
img() { local s=$1; shift; "$tool" --state-dir "$s" "$@"; }
snapshot() { (cd "$1" && find . -path ./images/lock -prune -o -print0 | sort -z | xargs -0 ls -ld --time-style=+ | awk '{print $1, $5, $NF}'; if [ -e images/index.json ]; then cat images/index.json; fi) ; }
refused() { # refused STATE EXPECTED-MESSAGE-FRAGMENT ARGS...: must exit 1 with the message, store unchanged
  local s=$1 frag=$2; shift 2
  local before after out rc=0
  before=$(snapshot "$s")
  out=$(img "$s" "$@" 2>&1 >/dev/null) || rc=$?
  [ "$rc" = 1 ] || fail "'$*' exited $rc, want 1 ($out)"
  grep -q -- "$frag" <<<"$out" || fail "'$*' said '$out', want '$frag'"
  after=$(snapshot "$s")
  [ "$before" = "$after" ] || fail "'$*' changed the store"
  echo "ok refused: $* -> $(tail -1 <<<"$out")"
}
check_rootfs() { # check_rootfs STATE REF: same tree as the source, busybox runs in it
  local dir
  dir=$(img "$1" rootfs "$2" 2>/dev/null) || fail "rootfs $2"
  diff -r --no-dereference "$work/rfs" "$dir" >/dev/null || fail "rootfs of $2 differs from the source"
  [ "$(chroot "$dir" /bin/sh -c 'echo hello-from-$(basename $0)')" = "hello-from-sh" ] \
    || fail "busybox does not run in the rootfs of $2"
  img "$1" verify "$2" >/dev/null 2>&1 || fail "verify $2"
}

# --- a busybox root file system and our image of it
mkdir -p "$work/rfs/bin" "$work/rfs/etc" "$work/rfs/tmp"
cp /bin/busybox "$work/rfs/bin/busybox"
ln -s busybox "$work/rfs/bin/sh"
ln -s /bin/busybox "$work/rfs/bin/echo"
echo "root:x:0:0::/:/bin/sh" >"$work/rfs/etc/passwd"
chmod 1777 "$work/rfs/tmp"
s1=$work/s1
ref=$(img "$s1" build --rootfs "$work/rfs" --name test/busybox 2>/dev/null)
[[ "$ref" =~ ^test/busybox@sha256:[0-9a-f]{64}$ ]] || fail "build printed '$ref'"
digest=${ref#*@}
check_rootfs "$s1" "$ref"
echo "ok build $ref"

# --- the prepared rootfs is a working overlayfs lower layer, and stays untouched
lower=$(img "$s1" rootfs "$ref" 2>/dev/null)
mkdir -p "$work/ovl/upper" "$work/ovl/work" "$work/ovl/merged"
mount -t overlay overlay -o "lowerdir=$lower,upperdir=$work/ovl/upper,workdir=$work/ovl/work" \
  "$work/ovl/merged" || fail "overlay mount over $lower"
merged=$work/ovl/merged
chroot "$merged" /bin/sh -c 'echo changed >/etc/passwd && echo new >/tmp/new && rm /bin/echo' \
  || fail "cannot write in the overlay"
refused "$s1" "in use" rm "$ref"
umount "$merged"
merged=
# a mount in a sandbox's private mount namespace counts too
command -v unshare >/dev/null || fail "unshare (util-linux) missing"
unshare --mount --propagation private /bin/sh -c \
  "mount -t overlay overlay -o lowerdir=$lower,upperdir=$work/ovl/upper,workdir=$work/ovl/work \
   $work/ovl/merged && touch $work/ovl/ready && exec sleep 60" &
ns_pid=$!
for _ in $(seq 100); do [ -e "$work/ovl/ready" ] && break; sleep 0.05; done
[ -e "$work/ovl/ready" ] || fail "overlay in a private namespace did not come up"
grep -q "$work/ovl/merged" /proc/self/mountinfo && fail "the private mount leaked to the host"
refused "$s1" "in use" rm "$ref"
kill "$ns_pid"
rc=0; wait "$ns_pid" || rc=$?
[ "$rc" = 143 ] || fail "the overlay's namespace ended with status $rc, not 143 (our SIGTERM)"
ns_pid=
cmp -s "$lower/etc/passwd" "$work/rfs/etc/passwd" && [ ! -e "$lower/tmp/new" ] && [ -L "$lower/bin/echo" ] \
  || fail "writes through the overlay reached the image's rootfs"
img "$s1" verify "$ref" >/dev/null 2>&1 || fail "verify after overlay use"
echo "ok overlay lower $lower"

# --- skopeo reads our store and writes every format we import
store=oci:$s1/images:test/busybox
skopeo copy -q "$store" "oci:$work/gz:gz" --dest-compress
skopeo copy -q "$store" "oci:$work/zst:zst" --dest-compress --dest-compress-format zstd
skopeo copy -q "$store" "oci-archive:$work/oa.tar:oa"
skopeo copy -q "$store" "docker-archive:$work/da.tar:test/busybox:1"
grep -q 'tar+gzip' "$work"/gz/blobs/sha256/* || fail "skopeo did not gzip"
grep -q 'tar+zstd' "$work"/zst/blobs/sha256/* || fail "skopeo did not use zstd"
s2=$work/s2
for input in "$work/gz" "$work/zst" "$work/oa.tar" "$work/da.tar"; do
  r=$(img "$s2" import "$input" 2>/dev/null) || fail "import $input"
  check_rootfs "$s2" "${r#*@}"
  echo "ok import $(basename "$input") -> $r"
done
# docker-archive holds the uncompressed layer: we rebuild exactly our original manifest
[ "$(img "$s2" import "$work/da.tar" --name again 2>/dev/null)" = "again@$digest" ] \
  || fail "docker-archive import did not reproduce $digest"
[ "$(img "$s2" list | grep -c sha256:)" = 5 ] || fail "list: $(img "$s2" list)"

# --- corrupted and truncated archives are refused, nothing stored
mkdir "$work/da-x"
tar -C "$work/da-x" -xf "$work/da.tar"
big=$(find "$work/da-x" -type f -size +100k | head -1)   # the layer: flip one byte in busybox
[ -n "$big" ] || fail "no layer in the docker-archive"
printf '\377' | dd of="$big" bs=1 seek=$(( $(stat -c %s "$big") / 2 )) conv=notrunc status=none
tar -C "$work/da-x" -cf "$work/da-bad.tar" .
refused "$s2" "config says" import "$work/da-bad.tar"
head -c $(( $(stat -c %s "$work/da.tar") / 2 )) "$work/da.tar" >"$work/da-trunc.tar"
refused "$s2" "truncated" import "$work/da-trunc.tar"
head -c $(( $(stat -c %s "$work/oa.tar") - 5000 )) "$work/oa.tar" >"$work/oa-trunc.tar"
refused "$s2" "" import "$work/oa-trunc.tar"

# --- a registry on loopback, images pushed by skopeo, pulled by digest
# The port is picked below the kernel's ephemeral range (32768-60999 here), where no connect()
# of a test beside this one takes it as a source port; a listener beside this one may still
# bind it between the pick and the registry's bind, so a lost race ("address already in use")
# picks again, up to five times.
reg_up() { # reg_up PORT: start the registry on PORT; 0 up, 1 port taken, fails otherwise
  local p=$1 _
  cat >"$work/reg/config.yml" <<YML
version: 0.1
log:
  level: error
storage:
  filesystem:
    rootdirectory: $work/reg/data
http:
  addr: 127.0.0.1:$p
YML
  docker-registry serve "$work/reg/config.yml" >"$work/reg/log" 2>&1 &
  reg_pid=$!
  for _ in $(seq 100); do
    curl -fs "http://127.0.0.1:$p/v2/" >/dev/null 2>&1 && return 0
    if ! kill -0 "$reg_pid" 2>/dev/null; then
      local st=0
      wait "$reg_pid" 2>/dev/null || st=$?
      reg_pid=
      grep -q "address already in use" "$work/reg/log" && return 1
      cat "$work/reg/log" >&2; fail "docker-registry died (status $st)"
    fi
    sleep 0.1
  done
  fail "docker-registry did not come up on port $p"
}
mkdir -p "$work/reg"
port=
for _ in 1 2 3 4 5; do
  p=$(( 20000 + RANDOM % 12768 ))
  (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null && continue # something answers there
  if reg_up "$p"; then port=$p; break; fi
  echo "port $p was taken before the registry bound it; picking another"
done
[ -n "$port" ] || { cat "$work/reg/log" >&2; fail "docker-registry found no free port in 5 tries"; }
curl -fs "http://127.0.0.1:$port/v2/" >/dev/null || fail "docker-registry did not come up"
skopeo copy -q --dest-tls-verify=false --digestfile "$work/zdig" "oci:$work/zst:zst" \
  "docker://127.0.0.1:$port/test/busybox:zstd"
zdig=$(cat "$work/zdig")
s3=$work/s3
r=$(img "$s3" pull "127.0.0.1:$port/test/busybox@$zdig" 2>/dev/null) || fail "pull"
[ "$r" = "127.0.0.1:$port/test/busybox@$zdig" ] || fail "pull printed '$r'"
check_rootfs "$s3" "$r"
r=$(img "$s3" pull "mirror.invalid/test/busybox@$zdig" --mirror "mirror.invalid=http://127.0.0.1:$port" 2>/dev/null) \
  || fail "pull through the mirror map"
[ "$r" = "mirror.invalid/test/busybox@$zdig" ] || fail "mirror pull printed '$r'"
echo "ok pull $zdig (direct and through a mirror)"
refused "$s3" "not found" pull "127.0.0.1:$port/test/busybox@sha256:$(printf '%064d' 0)"
refused "$s3" "pinned by digest" pull "127.0.0.1:$port/test/busybox:zstd"
# (a digest already held needs no download; a fresh store must ask the registry)
s5=$work/s5
img "$s5" list >/dev/null
refused "$s5" "not found" pull "127.0.0.1:$port/test/nothing@$zdig"
# a registry serving other bytes under a digest: the digest check refuses it (a corrupted blob
# in the registry's storage)
layer=$(grep -o '"layers":\[{[^}]*' "$work/zst/blobs/sha256/${zdig#sha256:}" | grep -o 'sha256:[0-9a-f]\{64\}' | cut -c8-)
blob=$(find "$work/reg/data" -path "*/blobs/sha256/*/$layer/data")
[ -f "$blob" ] || fail "registry layer blob not found"
printf 'X' | dd of="$blob" bs=1 seek=100 conv=notrunc status=none
s6=$work/s6
img "$s6" list >/dev/null
refused "$s6" "digest mismatch" pull "127.0.0.1:$port/test/busybox@$zdig"

# --- usage errors are exit code 2
rc=0; img "$s3" frobnicate >/dev/null 2>&1 || rc=$?; [ "$rc" = 2 ] || fail "unknown command exited $rc"
rc=0; img "$s3" build >/dev/null 2>&1 || rc=$?; [ "$rc" = 2 ] || fail "build without --rootfs exited $rc"

# --- the guest image script (busybox stands in for a static guest binary)
g1=$(KAGENT_GUEST_BIN=/bin/busybox "$src/deploy/build-guest-image.sh" "$build" "$work/s4")
g2=$(KAGENT_GUEST_BIN=/bin/busybox "$src/deploy/build-guest-image.sh" "$build" "$work/s4")
[[ "$g1" =~ ^sha256:[0-9a-f]{64}$ ]] && [ "$g1" = "$g2" ] || fail "guest image digests '$g1' '$g2'"
gdir=$(img "$work/s4" rootfs "$g1" 2>/dev/null)
[ -x "$gdir/run/kagent/guest" ] && cmp -s "$gdir/run/kagent/guest" /bin/busybox || fail "guest not at /run/kagent/guest"
rc=0; KAGENT_GUEST_BIN=/bin/ls "$src/deploy/build-guest-image.sh" "$build" "$work/s4" >/dev/null 2>&1 || rc=$?
[ "$rc" = 1 ] || fail "a dynamic guest binary was accepted"
echo "ok guest image $g1"

# --- with nothing mounted, rm takes everything only that image used
img "$s1" rm "$ref" >/dev/null 2>&1 || fail "rm $ref"
[ -z "$(find "$s1/images/blobs/sha256" "$s1/images/layers" "$s1/images/rootfs" -mindepth 1)" ] \
  || fail "rm left blobs or caches behind"
echo "ok rm"
echo "PASS"
