#!/usr/bin/env bash
# Usage: flood.sh MESHPLAN
# Two ranks each write 61.8 MB to stdout and 41.2 MB to stderr at once (206
# MB in all, lines of 103 bytes), as fast as `yes` can. Prints, per stream of
# the launcher, how many lines arrived whole and prefixed by the rank that
# wrote them, how many did not (a line cut or mixed with another rank's),
# and the time the job took. A launcher that blocked on one pipe would
# stall the other writers; one that split or interleaved lines would show
# bad lines.
set -uo pipefail
meshplan=$1
line=$(printf 'x%.0s' $(seq 100))
start=$(date +%s.%N)
count() { # STREAM-LETTER
  LC_ALL=C awk -v s="$1" -v x="$line" '
    { if ($0 == "[rank 0] " s "0" x || $0 == "[rank 1] " s "1" x) good++; else bad++ }
    END { printf "%d %d\n", good, bad }'
}
{ "$meshplan" run -n 2 -- sh -c "yes \"E\${RANK}$line\" | head -c 41200000 >&2 &
    yes \"O\${RANK}$line\" | head -c 61800000; wait" 2>&1 1>&3 | count E >"$TMPDIR/flood.err.$$"
} 3>&1 | count O >"$TMPDIR/flood.out.$$"
end=$(date +%s.%N)
read -r good bad <"$TMPDIR/flood.out.$$"
echo "stdout lines $good bad $bad"
read -r good bad <"$TMPDIR/flood.err.$$"
echo "stderr lines $good bad $bad"
rm -f "$TMPDIR/flood.out.$$" "$TMPDIR/flood.err.$$"
echo "took $(echo "$end - $start" | bc) s" >&2
