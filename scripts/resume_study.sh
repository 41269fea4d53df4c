#!/usr/bin/env bash
# Start or continue a study's sweep on a frozen worktree (docs/results.md, "Study 3: status"):
#   scripts/resume_study.sh COMMIT WORKTREE SWEEP_FILE RULES_FILE RESULTS_DIR
# e.g. scripts/resume_study.sh eb1362e ../study3 configs/study3.yaml configs/study/study3_rules.yaml results/study3
# RULES_FILE - runs the sweep whole, with no decisions (a pilot):
#   scripts/resume_study.sh COMMIT ../pilot configs/study4b_pilot.yaml - results/study4b_pilot
# Makes the frozen worktree of COMMIT if it is missing, copies into it the finished runs and the
# looks log committed here (a look already taken must not be judged again), then starts, in the
# background and under nice 19, `semrl sweep SWEEP_FILE --until-decided RULES_FILE` in the worktree
# (SWEEP_FILE is the worktree's, RULES_FILE this repository's) and commit_finished_runs.sh here.
# Logs: WORKTREE.sweep.log and WORKTREE.watcher.log beside the worktree.
set -euo pipefail
[ $# -eq 5 ] || { sed -n 2,9p "$0" >&2; exit 2; }
commit=$1 tree=$2 sweep_file=$3 rules=$4 results=$5
repo=$(git rev-parse --show-toplevel)
if [ "$rules" = - ]; then
  until_decided=()
else
  [ -f "$rules" ] || { echo "no rules file $rules" >&2; exit 2; }
  rules=$(cd "$(dirname "$rules")" && pwd)/$(basename "$rules")
  until_decided=(--until-decided "$rules")
fi
if [ ! -d "$tree" ]; then
  git worktree prune
  git worktree add -q "$tree" "$commit"
fi
tree=$(cd "$tree" && pwd)
head=$(git -C "$tree" rev-parse HEAD)
[ "$head" = "$(git rev-parse "$commit^{commit}")" ] || { echo "$tree is at $head, not $commit" >&2; exit 2; }
[ -z "$(git -C "$tree" status --porcelain --untracked-files=no)" ] || {
  echo "$tree has changes to tracked files: a frozen worktree must not" >&2; exit 2; }
if pgrep -f -- "semrl sweep $sweep_file" >/dev/null; then
  echo "a sweep of $sweep_file is already running" >&2; exit 2
fi
mkdir -p "$tree/$results"
copied=0
for done in "$repo/$results"/*/seed-*/sweep_done.json; do
  [ -e "$done" ] || continue
  run=$(dirname "$done"); rel=${run#"$repo/$results"/}
  if [ ! -e "$tree/$results/$rel/sweep_done.json" ]; then
    rm -rf "${tree:?}/$results/$rel" && mkdir -p "$tree/$results/$rel"
    cp -r "$run"/. "$tree/$results/$rel"/ && copied=$((copied + 1))
    # plain again: the frozen commit may be older than semrl's reading of compressed records
    find "$tree/$results/$rel" -name '*.jsonl.gz' -exec gunzip -f {} +
  fi
done
[ ! -e "$repo/$results/looks.jsonl" ] || cp "$repo/$results/looks.jsonl" "$tree/$results/looks.jsonl"
echo "finished runs copied into $tree/$results: $copied"
python=${PYTHON:-python}
(cd "$tree" && PYTHONPATH=src nohup nice -n 19 "$python" -m semrl sweep "$sweep_file" \
   "${until_decided[@]}" >> "$tree.sweep.log" 2>&1 &)
(cd "$repo" && nohup scripts/commit_finished_runs.sh "$tree/$results" "$results" 60 \
   >> "$tree.watcher.log" 2>&1 &)
echo "sweep: $tree.sweep.log; commits: $tree.watcher.log"
