#!/usr/bin/env bash
# Continue Study 4a on a new machine (docs/results.md, "Study 4a: status"):
#   scripts/resume_study4a.sh [WORKTREE]     (default ../study4a)
# Makes the frozen worktree of the study's commit (its pre-registration with its deviations) if it
# is missing, copies into it what has landed here (results/study4a: explorations resume from their
# records; a training run that landed without its checkpoint is trained again by scripts/study4a.sh
# and checked step by step against the landed metrics), then starts the study there in the
# background under nice 19.
# Log: WORKTREE.log beside the worktree.
set -euo pipefail
commit=3ec36c1  # Study 4a: its pre-registration (25085db) with deviation 1 (docs/results.md)
driver=9583fb5  # its script with deviations 2 (landing compressed) and 3 (no retraining of a settled policy)
tree=${1:-../study4a}
repo=$(git rev-parse --show-toplevel)
if [ ! -d "$tree" ]; then
  git worktree prune
  git worktree add -q "$tree" "$commit"
fi
tree=$(cd "$tree" && pwd)
[ "$(git -C "$tree" rev-parse HEAD)" = "$(git rev-parse "$commit^{commit}")" ] || {
  echo "$tree is not at $commit" >&2; exit 2; }
# the driver beside the worktree (WORKTREE.study4a.sh); "study4a\.sh" would match this script too
if pgrep -f "[.]study4a[.]sh" >/dev/null; then echo "Study 4a is already running" >&2; exit 2; fi
if [ -d "$repo/results/study4a" ]; then
  mkdir -p "$tree/results/study4a"
  for dir in "$repo"/results/study4a/*/; do
    name=$(basename "$dir")
    [ "$name" = train ] && continue  # trained again where its checkpoint is missing
    mkdir -p "$tree/results/study4a/$name"
    cp -rn "$dir". "$tree/results/study4a/$name/"  # never over what the worktree has
    # explorations land compressed (deviation 2) and continue by appending to their plain logs
    for log in "$tree/results/study4a/$name"/*.jsonl.gz; do
      [ -e "$log" ] || continue
      [ -e "${log%.gz}" ] || gunzip -k "$log"
      rm -f "$log"
    done
  done
fi
# the study's script as of deviation 2, beside the worktree: it runs there, on the worktree's code
git show "$driver:scripts/study4a.sh" > "$tree.study4a.sh"
(cd "$tree" && PYTHON=${PYTHON:-python} nohup nice -n 19 bash "$tree.study4a.sh" >> "$tree.log" 2>&1 &)
echo "Study 4a continues in $tree; log: $tree.log"
