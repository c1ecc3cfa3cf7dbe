#!/usr/bin/env bash
# Greedy text of an aarch64 `arbor` under qemu against the x86-64 build's.
#
#   benches/arm64-same-text.sh X86_ARBOR ARM64_ARBOR OUT_DIR
#
# 1. Qwen2.5-Coder-0.5B, chat form, 32 greedy tokens, the first 8 MT-Bench
#    questions: the x86 build natively, the aarch64 build under
#    `qemu-aarch64` on `-cpu max` (smmla + sdot kernels) and `-cpu
#    cortex-a72` (plain NEON); every text must equal the x86 one.
# 2. The 1.5B target with the 0.5B draft (`tree`), and under
#    `--memory-budget 800MiB` (streamed layers) plain and as a `tree` of
#    its own drafts, 2 prompts x 24 tokens on `-cpu max`, each against the
#    aarch64 target-only text. (`auto` would first sample a latency
#    profile, which takes most of an hour emulated.)
# PARTS="0.5b 1.5b" (the default) picks the parts. Exits non-zero if any
# text differs. Emulation says nothing of speed.
set -euo pipefail
x86=$1 arm=$2 out=$3
home=${ARBOR_HOME:-$HOME/.cache/arbor}
models=$home/models
mkdir -p "$out"
qemu() { QEMU_CPU=$1 qemu-aarch64 -L /usr/aarch64-linux-gnu "$arm" "${@:2}"; }
mapfile -t prompts < <(python3 -c '
import json, sys
for line in list(open(sys.argv[1]))[:8]:
    print(json.loads(line)["turns"][0].replace("\n", " "))
' "$home/datasets/mt-bench-question.jsonl")

gen=(generate --chat --temperature 0 --no-profile --threads 2)
fail=0
parts=${PARTS:-0.5b 1.5b}
[[ " $parts " == *" 0.5b "* ]] && for i in "${!prompts[@]}"; do
    p=${prompts[$i]}
    "$x86" "${gen[@]}" --model "$models/qwen2.5-coder-0.5b.gguf" --max-tokens 32 \
        --prompt "$p" > "$out/0.5b-$i-x86.txt" 2> "$out/0.5b-$i-x86.log"
    for cpu in max cortex-a72; do
        qemu "$cpu" "${gen[@]}" --model "$models/qwen2.5-coder-0.5b.gguf" --max-tokens 32 \
            --prompt "$p" > "$out/0.5b-$i-$cpu.txt" 2> "$out/0.5b-$i-$cpu.log"
        if cmp -s "$out/0.5b-$i-x86.txt" "$out/0.5b-$i-$cpu.txt"; then
            echo "0.5B prompt $i: $cpu = x86"
        else
            echo "0.5B prompt $i: $cpu DIFFERS from x86"; fail=1
        fi
    done
done

[[ " $parts " == *" 1.5b "* ]] && for i in 0 1; do
    p=${prompts[$i]}
    common=("${gen[@]}" --model "$models/qwen2.5-coder-1.5b.gguf" --max-tokens 24 --prompt "$p")
    qemu max "${common[@]}" --strategy autoregressive \
        > "$out/1.5b-$i-ar.txt" 2> "$out/1.5b-$i-ar.log"
    qemu max "${common[@]}" --strategy tree --draft "$models/qwen2.5-coder-0.5b.gguf" \
        > "$out/1.5b-$i-tree.txt" 2> "$out/1.5b-$i-tree.log"
    # 800 MiB cannot hold the 0.5B draft beside the 1.5B's minimum (924
    # MiB): streamed plain decoding, and a tree of the target's own
    # drafts (`self`) verified over streamed layers.
    qemu max "${common[@]}" --memory-budget 800MiB --strategy autoregressive-pipelined \
        > "$out/1.5b-$i-800MiB-ar.txt" 2> "$out/1.5b-$i-800MiB-ar.log"
    qemu max "${common[@]}" --memory-budget 800MiB --strategy tree --draft self \
        > "$out/1.5b-$i-800MiB-tree-self.txt" 2> "$out/1.5b-$i-800MiB-tree-self.log"
    for run in tree 800MiB-ar 800MiB-tree-self; do
        if cmp -s "$out/1.5b-$i-ar.txt" "$out/1.5b-$i-$run.txt"; then
            echo "1.5B prompt $i: $run = target alone"
        else
            echo "1.5B prompt $i: $run DIFFERS from target alone"; fail=1
        fi
    done
done
exit $fail
