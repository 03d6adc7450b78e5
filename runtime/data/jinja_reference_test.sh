#!/bin/bash
# runtime/data/jinja.h against python3-jinja2, configured as transformers
# configures it for chat templates.
set -euo pipefail
here="$TEST_SRCDIR/$TEST_WORKSPACE/runtime/data"
/usr/bin/python3 "$here/jinja_reference_test.py" "$here/jinja_render"
