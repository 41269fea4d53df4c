#!/usr/bin/env bash
# Study 4a as drafted (docs/results.md, "Study 4a: exploration at equal cost"; configs/study/study4a_rules.yaml), to run
# from a frozen worktree of the commit that pre-registers it, under nice, committing each step:
#
#   git worktree add ../study4a <commit> && cd ../study4a && nice bash scripts/study4a.sh
#
# 1. The base policy: every tree method and independent sampling on the first 256 held-out
#    problems, judged at look 1; the next 256 only while a primary rule is open.
# 2. The trained policies: Dr.GRPO in Study 3's regime on seeds 200 and 201 (step-30 checkpoints),
#    each explored and judged the same way (secondary evidence, each at its own alpha).
set -euo pipefail
out=results/study4a
rules=configs/study/study4a_rules.yaml
explore() {  # explore OUTPUT LIMIT [overrides...]
    local dir=$1 limit=$2
    shift 2
    PYTHONPATH=src python -m semrl explore --config configs/study4a.yaml --methods rose treepo fr3e latr \
        --seeds 0 1 --data arithmetic --limit "$limit" --independent-samples 32 --output "$dir" \
        --decide "$rules" "$@"
    git add "$dir" && git commit -q -m "Study 4a: $dir explored to $limit problems" || true
}
primary_open() {  # whether the last look of DIR left a primary rule undecided
    python - "$1/looks.jsonl" <<'PY'
import json, sys
look = [json.loads(line) for line in open(sys.argv[1])][-1]
settled = ("decided", "decided against", "ruled out")
sys.exit(0 if any(r["family"] == "primary" and r["outcome"] not in settled for r in look["rules"]) else 1)
PY
}
policy() {  # policy OUTPUT [overrides...]
    local dir=$1
    shift
    explore "$dir" 256 "$@"
    if primary_open "$dir"; then explore "$dir" 512 "$@"; fi
}
policy "$out/base"
PYTHONPATH=src python -m semrl sweep configs/study4a_train.yaml
for seed in 200 201; do
    checkpoint=$(ls -d "$out/train/dr_grpo/seed-$seed/checkpoints/step-"* | tail -1)
    policy "$out/dr_grpo-seed-$seed" "model.name=$checkpoint"
done
