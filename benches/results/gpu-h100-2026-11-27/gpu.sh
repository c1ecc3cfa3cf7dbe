#!/bin/bash
# One prepared GPU run (issue 32): random Qwen2.5-7B-shape (then 1.5B-shape)
# Q4_K_M files made here by our GGUF writer; decode speed, L_fp(n) and GPU
# memory on wgpu.
set -u
cd "$(dirname "$0")"
export LD_LIBRARY_PATH=$PWD/lib:${LD_LIBRARY_PATH:-}
export ARBOR_HOME=/tmp/arbor-home
B=/tmp/arbor; gunzip -c arbor.gz > $B; chmod +x $B
O=${OUT:-/tmp/out}
mkdir -p $O
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv | tee $O/gpu.txt
sample() { while true; do echo "$(date +%s.%N) $(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits) $(nvidia-smi --query-compute-apps=used_memory --format=csv,noheader,nounits | tr '\n' ' ')" >> $O/mem-$1.txt; sleep 0.3; done; }
for shape in qwen2.5-7b qwen2.5-1.5b; do
  if [ $(( $(date +%s) - T0 )) -gt 300 ]; then echo "skip $shape (time)" | tee -a $O/log.txt; continue; fi
  f=/tmp/$shape.gguf
  /usr/bin/time -f "random-model %e s" $B bench random-model --shape $shape --out $f 2>&1 | tee -a $O/log.txt
  ls -l $f | tee -a $O/log.txt
  sample $shape & S=$!
  timeout 150 $B bench decode --model $f --backend wgpu --tokens 64 --prompt-tokens 128 > $O/decode-$shape.json 2> $O/decode-$shape.err
  echo "decode rc=$? at $(( $(date +%s) - T0 )) s" | tee -a $O/log.txt; cat $O/decode-$shape.json; tail -4 $O/decode-$shape.err
  kill $S
  timeout 150 $B profile --model $f --backend wgpu --json --refresh > $O/profile-$shape.json 2> $O/profile-$shape.err
  echo "profile rc=$? at $(( $(date +%s) - T0 )) s" | tee -a $O/log.txt; head -c 2500 $O/profile-$shape.json; echo; tail -4 $O/profile-$shape.err
  rm -f $f
done
