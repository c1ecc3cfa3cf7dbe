#!/usr/bin/env bash
# O_DIRECT read rate of the F16 file with 0, 1 or 2 busy cores beside it.
F=/root/.cache/arbor/models/qwen2.5-coder-1.5b-f16.gguf
rd() { dd if=$F of=/dev/null bs=8M count=256 skip=$1 iflag=direct 2>&1 | tail -1 | awk '{print $(NF-1), $NF}'; }
for rep in 1 2 3; do
  for busy in 0 1 2; do
    pids=""
    for i in $(seq 1 $busy); do (while :; do :; done) & pids="$pids $!"; done
    echo "rep $rep busy $busy: $(rd $(( (rep*busy) % 2 * 64 )))"
    [ -n "$pids" ] && kill $pids; wait 2>/dev/null
  done
done
