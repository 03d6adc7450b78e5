# Sourced by the golden tests: expect_mutation_fails SCRIPT DUMP MUTATION
# runs a reference SCRIPT on DUMP with a deliberate change to the reference
# (MUTATION), which must fail the comparison ("golden: FAILED"), or the
# tolerances could hide it; it says which check caught it.
expect_mutation_fails() {
  local script="$1" dump="$2" mutation="$3" log="$TEST_TMPDIR/mutation.log"
  if /usr/bin/python3 "$script" "$dump" "$mutation" >"$log" 2>&1; then
    echo "mutation $mutation passed the comparison: $(basename "$script") cannot see it"
    cat "$log"
    exit 1
  fi
  grep -q "golden: FAILED" "$log" || { cat "$log"; exit 1; }
  echo "mutation $mutation: fails as it must ($(grep -m1 -o '^  [a-z/_.0-9]*' "$log" | tr -d ' '))"
}
