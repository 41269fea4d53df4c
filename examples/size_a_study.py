"""Size a study's evaluation from a pilot sweep: split the pilot's seed-to-seed variance of one
pair's final difference into the evaluation's draw and training (semrl.studies.variance), then list
the cheapest (problems, samples, seeds) whose 95% interval half-width reaches a target, at the
estimated training variance and at the upper end of its range (docs/results.md, "Where the
variance is"). Example, Study 3's sizing from Study 2:

    python examples/size_a_study.py results/study_sparse rose dr_grpo pass@16 --target 0.03 \\
        --seed-cost-min 11.8 --sample-cost-s 0.063
"""

from __future__ import annotations

import argparse

from semrl.studies.discovery import find_runs
from semrl.studies.variance import cheapest_designs, decompose, final_samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sweep_dir")
    parser.add_argument("variant")
    parser.add_argument("baseline")
    parser.add_argument("metric", help="pass@k, mean@n, distinct_answers or response_length/correct")
    parser.add_argument("--split", default="eval")
    parser.add_argument("--target", type=float, required=True, help="95%% interval half-width wanted")
    parser.add_argument(
        "--seed-cost-min",
        type=float,
        required=True,
        help="training minutes of one variant's seed (both variants of the pair are counted)",
    )
    parser.add_argument("--sample-cost-s", type=float, required=True, help="seconds per evaluation sample")
    parser.add_argument(
        "--evaluations",
        type=int,
        default=2,
        help="final evaluations per seed the rule reads (default 2: the pair's two variants)",
    )
    args = parser.parse_args()

    groups = find_runs([args.sweep_dir])
    by_seed = {r.seed: r for r in groups[args.baseline]}
    paired = []
    for run in groups[args.variant]:
        if run.seed in by_seed:
            a, b = final_samples(run, args.split), final_samples(by_seed[run.seed], args.split)
            if a is not None and b is not None:
                paired.append((a, b))
    d = decompose(args.metric, (args.variant, args.baseline), paired)
    lo, hi = d.var_total_ci
    print(
        f"{args.variant} - {args.baseline} {args.metric}: {len(paired)} seeds, {d.problems} problems x "
        f"{d.samples} samples; var(D) {d.var_total:.3g} [{lo:.3g}, {hi:.3g}], draw {d.var_draw:.3g} "
        f"(samples {d.var_samples:.3g}), training {d.var_train:.3g}"
    )
    upper_train = max(hi - d.var_draw, 0.0)
    for label, train in (
        ("estimated training variance", None),
        (f"training variance {upper_train:.3g} (var(D)'s upper 95% bound less the draw)", upper_train),
    ):
        designs = cheapest_designs(
            d,
            args.target,
            seed_cost_s=2 * 60 * args.seed_cost_min,
            sample_cost_s=args.sample_cost_s,
            var_train=train,
            evaluations=args.evaluations,
        )
        print(f"\nat the {label}:")
        print("| problems | samples | seeds | half-width | compute (h) |\n|---|---|---|---|---|")
        for x in designs[:6]:
            print(f"| {x.problems} | {x.samples} | {x.seeds} | {x.half_width:.4f} | {x.cost_s / 3600:.1f} |")
        if not designs:
            print("| no design of at most 40 seeds reaches the target | | | | |")


if __name__ == "__main__":
    main()
