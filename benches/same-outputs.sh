#!/usr/bin/env bash
# same-outputs.sh OLD_ARBOR NEW_ARBOR [OUTDIR]: greedy `arbor generate --chat`
# text of 8 MT-Bench first turns (spread over the categories, as
# `bench spec --limit 8` picks them) from two builds, for every strategy,
# with and without a memory budget; prints how many outputs are identical.
# Used to show that a refactor changed no token (issue 12). Needs the
# default model pair and the mt-bench dataset (`arbor fetch`,
# `arbor fetch --dataset mt-bench`). About 40 minutes per build on 2 cores.
# SAME_OUTPUTS_ONLY=old|new runs one half into OUTDIR (the other half can
# run later into the same OUTDIR, e.g. before and after a rebuild); the
# comparison runs when both halves are there. SAME_OUTPUTS_PROMPTS=N takes
# the first N of the 8 prompts (default 8).
set -u
OLD=$1 NEW=$2 OUT=${3:-$(mktemp -d)}
home=${ARBOR_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/arbor}
prompts() {
  python3 - "$home/datasets/mt-bench-question.jsonl" "${SAME_OUTPUTS_PROMPTS:-8}" <<'PY'
import json, sys
qs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
order, by = [], {}
for q in qs:
    c = q.get("category", "?")
    if c not in by:
        order.append(c); by[c] = []
    by[c].append(q["turns"][0])
out, r = [], 0
n = int(sys.argv[2])
while len(out) < n and any(r < len(v) for v in by.values()):
    for c in order:
        if r < len(by[c]) and len(out) < n:
            out.append(by[c][r])
    r += 1
for t in out:
    print(t.replace("\n", " "))
PY
}
run() { # BIN DIR
  local bin=$1 dir=$2 i=0 p s
  mkdir -p "$dir"
  while IFS= read -r p; do
    i=$((i + 1))
    for s in autoregressive chain tree static-tree tree-no-fallback tree-provisional; do
      "$bin" generate --chat --max-tokens 128 --draft qwen2.5-coder-0.5b --strategy $s --prompt "$p" \
        >"$dir/p$i-$s.txt" 2>"$dir/p$i-$s.err" || echo "failed: $bin p$i $s"
    done
    for s in autoregressive autoregressive-pipelined; do
      "$bin" generate --chat --max-tokens 48 --memory-budget 900MiB --strategy $s --prompt "$p" \
        >"$dir/p$i-900-$s.txt" 2>"$dir/p$i-900-$s.err" || echo "failed: $bin p$i 900 $s"
    done
    for s in chain tree-provisional; do
      "$bin" generate --chat --max-tokens 48 --memory-budget 1.3GiB --draft qwen2.5-coder-0.5b \
        --strategy $s --prompt "$p" >"$dir/p$i-1300-$s.txt" 2>"$dir/p$i-1300-$s.err" ||
        echo "failed: $bin p$i 1300 $s"
    done
    echo "$bin: prompt $i done" >&2
  done < <(prompts)
}
only=${SAME_OUTPUTS_ONLY:-}
[ "$only" != new ] && run "$OLD" "$OUT/old"
[ "$only" != old ] && run "$NEW" "$OUT/new"
[ -d "$OUT/old" ] && [ -d "$OUT/new" ] || { echo "one half done (outputs in $OUT)"; exit 0; }
same=0 differ=0
for f in "$OUT"/old/*.txt; do
  if cmp -s "$f" "$OUT/new/$(basename "$f")"; then same=$((same + 1)); else
    differ=$((differ + 1)); echo "differs: $(basename "$f")"; fi
done
echo "$same identical, $differ different (outputs in $OUT)"
