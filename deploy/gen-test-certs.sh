#!/usr/bin/env bash
# Self-signed test certificates with openssl (P-256 keys, 30 days): for tests and for
# `deploy/run-node.sh --tls`. Not for production: the CA key sits next to its certificate.
#   deploy/gen-test-certs.sh ca     DIR                       DIR/ca.pem, DIR/ca.key
#   deploy/gen-test-certs.sh server DIR NAME [SAN...]         DIR/NAME.pem, DIR/NAME.key, signed
#        by DIR/ca; SANs like DNS:kagent.example or IP:10.0.0.5 (default: DNS:localhost,
#        IP:127.0.0.1, IP:::1)
#   deploy/gen-test-certs.sh client DIR NAME IDENTITY         DIR/NAME.pem, DIR/NAME.key, signed
#        by DIR/ca, subject CN=IDENTITY (the identity kagentd maps it to)
# Keys are written mode 0600.
set -euo pipefail
die() { echo "gen-test-certs: $*" >&2; exit 2; }
command -v openssl >/dev/null || die "openssl is required (apt-get install openssl)"
[ $# -ge 2 ] || die "usage: $0 ca|server|client DIR ..."
kind=$1 dir=$2
shift 2
mkdir -p "$dir"

key() { (umask 077 && openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null); }

# sign NAME SUBJECT EXTENSIONS: DIR/NAME.key + a CSR, signed by DIR/ca into DIR/NAME.pem
sign() {
  local name=$1 subj=$2 ext=$3
  [ -f "$dir/ca.pem" ] && [ -f "$dir/ca.key" ] || die "$dir/ca.pem and ca.key first ('$0 ca $dir')"
  key "$dir/$name.key"
  openssl req -new -key "$dir/$name.key" -subj "$subj" -out "$dir/$name.csr" 2>/dev/null
  printf '%s\n' "$ext" > "$dir/$name.ext"
  openssl x509 -req -in "$dir/$name.csr" -CA "$dir/ca.pem" -CAkey "$dir/ca.key" -CAcreateserial \
    -days 30 -sha256 -extfile "$dir/$name.ext" -out "$dir/$name.pem" 2>/dev/null
  rm -f "$dir/$name.csr" "$dir/$name.ext"
}

case $kind in
ca)
  key "$dir/ca.key"
  openssl req -x509 -new -key "$dir/ca.key" -subj "/CN=kagent test CA $(date +%s%N)" -days 30 \
    -sha256 -addext "basicConstraints=critical,CA:TRUE" \
    -addext "keyUsage=critical,keyCertSign,cRLSign" -out "$dir/ca.pem" 2>/dev/null
  ;;
server)
  [ $# -ge 1 ] || die "usage: $0 server DIR NAME [SAN...]"
  name=$1
  shift
  [ $# -gt 0 ] || set -- DNS:localhost IP:127.0.0.1 IP:::1
  sans=$(IFS=,; echo "$*")
  sign "$name" "/CN=${1#*:}" "basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=serverAuth
subjectAltName=$sans"
  ;;
client)
  [ $# -eq 2 ] || die "usage: $0 client DIR NAME IDENTITY"
  sign "$1" "/CN=$2" "basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=clientAuth"
  ;;
*) die "unknown kind '$kind': want ca, server or client" ;;
esac
