#!/usr/bin/env bash
# structure.sizes: no source file over 1,500 lines and no function over 200
# lines without a "// Long because:" comment (scripts/long-functions.py
# --check, docs/architecture.md "Size rules") on the source tree; and, on a
# tree with planted violations, each one is reported, a long function with
# its reason is not, and a stale entry of the pending list fails, so that
# the check cannot pass by checking nothing.
#
#   sizes.sh SOURCE_DIR
set -euo pipefail
src=$(cd "$1" && pwd)
folders=(lib include tools runtime examples python bench scripts)
cd "$src"
python3 scripts/long-functions.py --check \
  --pending test/structure/pending-long-functions.txt "${folders[@]}"

work=$(mktemp -d "${TMPDIR:-/tmp}/meshplan-sizes-XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/lib" "$work/lib/test"
# A function of N lines as long-functions.py counts them (from the line of
# its "{" to the line of its "}"), after the comment line COMMENT if given.
function_of() { # NAME LINES [COMMENT]
  [[ -n ${3:-} ]] && echo "$3"
  echo "int $1(int x) {"
  for ((i = 0; i < $2 - 2; ++i)); do echo "  x += $i;"; done
  echo "  return x;"
  echo "}"
}
{
  function_of unexplained 201
  echo
  function_of explained 201 "// Long because: one table, entry by entry."
  echo
  function_of shortEnough 200
  echo
  function_of pendingOne 250
} >"$work/lib/Functions.cpp"
for ((i = 0; i < 1501; ++i)); do echo "// line $i"; done >"$work/lib/Long.h"
for ((i = 0; i < 1500; ++i)); do echo "// line $i"; done >"$work/lib/Fits.h"
for ((i = 0; i < 1600; ++i)); do echo "// line $i"; done >"$work/lib/test/Test.cpp"
printf 'lib/Functions.cpp pendingOne\nlib/Functions.cpp gone\n' >"$work/pending.txt"
if (cd "$work" && python3 "$src/scripts/long-functions.py" --check \
  --pending pending.txt lib) >"$work/out" 2>&1; then
  echo "FAIL: long-functions.py --check passed a tree with planted violations" >&2
  exit 1
fi
cat "$work/out"
for expected in \
  "lib/Functions.cpp:1: unexplained is 201 lines, over 200, with no \"// Long because:\" comment above it" \
  "lib/Long.h:1: 1501 lines, over the 1500-line limit for a source file" \
  "lib/Functions.cpp:" \
  "pendingOne is 250 lines (pending: pending.txt)" \
  "pending.txt: lib/Functions.cpp gone is no longer a function over 200 lines"; do
  grep -qF "$expected" "$work/out" || { echo "FAIL: not reported: $expected" >&2; exit 1; }
done
for unexpected in explained shortEnough Fits.h Test.cpp; do
  if grep -qw "$unexpected" "$work/out"; then
    echo "FAIL: reported although within the rules: $unexpected" >&2
    exit 1
  fi
done
echo "structure.sizes: the size rules hold, and planted violations are caught"
