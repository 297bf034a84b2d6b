#!/usr/bin/env bash
# Runs a command that must fail as a user error: exit code 2, nothing on
# stdout. Prints its stderr on stdout so FileCheck can check the message.
out=$(mktemp) err=$(mktemp)
trap 'rm -f "$out" "$err"' EXIT
"$@" >"$out" 2>"$err"
code=$?
if [ "$code" -ne 2 ]; then
  echo "expect-error: expected exit code 2, got $code from: $*" >&2
  cat "$err" >&2
  exit 1
fi
if [ -s "$out" ]; then
  echo "expect-error: command printed on stdout despite failing:" >&2
  cat "$out" >&2
  exit 1
fi
if [ "$(wc -l <"$err")" -ne 1 ]; then
  echo "expect-error: expected exactly one line on stderr, got:" >&2
  cat "$err" >&2
  exit 1
fi
cat "$err"
