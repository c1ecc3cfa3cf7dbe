#!/usr/bin/env bash
# Issue 30, 2026-12-02 (second session): does reading with several
# O_DIRECT streams raise this VM's read bandwidth? (It did not.)
# O_DIRECT read bandwidth: 1, 2, 4 parallel streams over the same 2 GiB of F
F=$1; TOTAL_MB=2048
one() { dd if=$F of=/dev/null bs=8M iflag=direct skip=$(( $1 / 8 )) count=$(( $2 / 8 )) 2>/dev/null; }
for rep in 1 2; do
for n in 1 2 4; do
  per=$(( TOTAL_MB / n ))
  t0=$(date +%s.%N)
  for i in $(seq 0 $((n-1))); do one $(( i * per )) $per & done; wait
  t1=$(date +%s.%N)
  echo "streams=$n $(echo "$TOTAL_MB / 1024 / ($t1 - $t0)" | bc -l | cut -c1-5) GiB/s"
done; done
