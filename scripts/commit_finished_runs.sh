#!/usr/bin/env bash
# Commit a study's finished runs and its looks to this repository as they come (docs/results.md):
#   scripts/commit_finished_runs.sh WORKTREE_RESULTS_DIR RESULTS_DIR [SECONDS]
# e.g. scripts/commit_finished_runs.sh ../study3/results/study3 results/study3 60
# Every SECONDS it copies each run whose sweep_done.json exists (without checkpoints, its JSON-lines
# records gzip-compressed: docs/sweeps.md, "Committing a study") and a changed looks.jsonl, and
# commits each on its own, touching no other path. Stop it with Ctrl-C.
set -euo pipefail
src=$(cd "$1" && pwd)
repo=$(git rev-parse --show-toplevel)
dst="$repo/$2"
every=${3:-60}
while true; do
  for done in "$src"/*/seed-*/sweep_done.json; do
    [ -e "$done" ] || continue
    run=$(dirname "$done"); rel=${run#"$src"/}
    if [ ! -e "$dst/$rel/sweep_done.json" ]; then
      mkdir -p "$dst/$rel"
      (cd "$run" && tar --exclude=./checkpoints -cf - .) | (cd "$dst/$rel" && tar -xf -)
      find "$dst/$rel" -name '*.jsonl' -exec gzip -9nf {} +  # records are committed compressed
      minutes=$(python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(round(d['seconds']/60,1))" "$done")
      commit=$(python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(((d.get('code') or {}).get('commit') or '?')[:7])" "$done")
      (cd "$repo" && git add "$2/$rel" && git commit -q -m "$(basename "$2"): $rel finished ($minutes min, code $commit)" -- "$2/$rel")
    fi
  done
  if [ -e "$src/looks.jsonl" ] && ! cmp -s "$src/looks.jsonl" "$dst/looks.jsonl"; then
    mkdir -p "$dst" && cp "$src/looks.jsonl" "$dst/looks.jsonl"
    (cd "$repo" && git add "$2/looks.jsonl" && git commit -q -m "$(basename "$2"): look $(wc -l < "$dst/looks.jsonl") taken" -- "$2/looks.jsonl")
  fi
  sleep "$every"
done
