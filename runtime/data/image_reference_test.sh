#!/bin/bash
# DecodeImage against PIL (Debian's python3-pil, for /usr/bin/python3).
set -euo pipefail
here="$TEST_SRCDIR/$TEST_WORKSPACE/runtime/data"
/usr/bin/python3 "$here/image_reference_test.py" "$TEST_TMPDIR" "$here/image_dump"
