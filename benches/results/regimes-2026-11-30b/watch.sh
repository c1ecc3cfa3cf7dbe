#!/usr/bin/env bash
# Stops sweep.sh when it reaches F16 at 0.5 GB/s and runs sweep-b.sh.
cd /work/sweep2
until grep -q "=== f16 cap 0.5" driver.log; do sleep 10; done
kill -- -9192
sleep 5
rm -f f16-cap0.5.jsonl f16-cap0.5.log f16-cap0.5.png
mv q8_0-cap1.* q8_0-cap2.* contaminated/
bash sweep-b.sh >> driver.log 2>&1
