#!/usr/bin/env bash
# The kagent binary links no gRPC, abseil or OpenSSL (they cost ~10 ms and ~2 ms of start-up;
# TLS loads OpenSSL with dlopen only for https://), and a plaintext command maps neither
# libssl nor libcrypto.
set -euo pipefail
kagent=${KAGENT_BUILD_DIR:?}/bridges/cli/kagent
fail() { echo "FAIL: $*" >&2; exit 1; }
[ -x "$kagent" ] || fail "$kagent is missing"
deps=$(ldd "$kagent")
bad=$(grep -Eo 'lib(grpc|gpr|absl|upb|ssl|crypto|re2|cares)[^ ]*' <<<"$deps" || true)
[ -z "$bad" ] || fail "kagent links $(tr '\n' ' ' <<<"$bad")"
# what the dynamic loader opens for a plaintext call (to a closed port)
opened=$(LD_DEBUG=files "$kagent" --api-url http://127.0.0.1:1 sandbox list 2>&1 >/dev/null |
         sed -n 's/.*file=\([^ ]*\).*/\1/p' | sort -u || true) # the call itself fails
grep -q libc.so <<<"$opened" || fail "LD_DEBUG saw no libraries at all: $opened"
! grep -Eq 'libssl|libcrypto' <<<"$opened" || fail "a plaintext call loads OpenSSL"
# and https:// does load it (so the check above can fail)
opened=$(LD_DEBUG=files "$kagent" --api-url https://127.0.0.1:1 --timeout 2s sandbox list 2>&1 \
         >/dev/null | sed -n 's/.*file=\([^ ]*\).*/\1/p' | sort -u || true)
grep -q libssl <<<"$opened" || fail "https:// did not load OpenSSL"
echo "PASS kagent: $(wc -l <<<"$deps") shared objects, no gRPC or OpenSSL linked; OpenSSL only for https://"
