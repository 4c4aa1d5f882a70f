#!/usr/bin/env bash
# /ui in headless Chromium (tests/integration/ui/ui_browser.py) against a real node whose
# operator signs in through the page's form (user-header mode). Screenshots go to
# $KAGENT_BUILD_DIR/test-artifacts/ui-*.png.
set -euo pipefail
source "${KAGENT_SOURCE_DIR:?}/tests/lib/node.sh"
NODE_EXTRA_YAML="auth:
  operators: [admin@kagent.dev]"
node_start
node_apply_template scratch
API=$API KAGENT=$KAGENT WORK=$WORK USER_ID=admin@kagent.dev \
  ARTIFACTS=$KAGENT_BUILD_DIR/test-artifacts /usr/bin/python3 "$KAGENT_SOURCE_DIR/tests/integration/ui/ui_browser.py" ||
  node_fail "the browser test failed"
node_stop
