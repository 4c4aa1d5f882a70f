# Test helper (source it): the npm packages a test uses, from its committed package-lock.json.
#   npm_from_lockfile SRC DEST   installs SRC/package.json + package-lock.json into DEST with
#                                `npm ci` (DEST/node_modules), under a lock (tests run at once),
#                                and reuses DEST while the lockfile is unchanged. A registry that
#                                drops a connection gets three tries; then the npm log is printed
#                                and the call fails (the caller fails its test).
npm_from_lockfile() {
  local src=$1 dest=$2 lockhash try lockfd
  command -v npm >/dev/null || { echo "npm is required (deploy/install-deps.sh)" >&2; return 1; }
  mkdir -p "$(dirname "$dest")"
  lockhash=$(sha256sum "$src/package-lock.json" | cut -d' ' -f1)
  exec {lockfd}>"$dest.lock"
  flock "$lockfd"
  if [ "$(cat "$dest/.lockhash" 2>/dev/null)" = "$lockhash" ] && [ -d "$dest/node_modules" ]; then
    exec {lockfd}>&-
    return 0
  fi
  for try in 1 2 3; do
    rm -rf "$dest"
    mkdir -p "$dest"
    cp "$src/package.json" "$src/package-lock.json" "$dest/"
    if (cd "$dest" && npm ci --no-audit --no-fund --ignore-scripts >"$dest/npm.log" 2>&1); then
      echo "$lockhash" > "$dest/.lockhash"
      exec {lockfd}>&-
      return 0
    fi
    echo "npm ci in $dest failed (try $try of 3)" >&2
    [ $try = 3 ] || sleep $((try * 10))
  done
  cat "$dest/npm.log" >&2
  exec {lockfd}>&-
  return 1
}
