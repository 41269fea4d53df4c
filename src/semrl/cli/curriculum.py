"""``semrl curriculum score``: per-problem semantic entropy for SENT's staged curriculum."""

from __future__ import annotations

import argparse
from pathlib import Path

from semrl.cli.common import (
    DEFAULTS,
    SubParsers,
    add_model_arg,
    add_model_io_args,
    check_model_arg,
    cli_verifier_pool,
    load_sampler,
    problems,
)


def add_parser(sub: SubParsers) -> None:
    cur = sub.add_parser(
        "curriculum",
        help="SENT curriculum tools",
        description="Score problems by semantic entropy for a staged curriculum (data.curriculum).",
    )
    cur_sub = cur.add_subparsers(dest="curriculum_command", required=True)
    score = cur_sub.add_parser(
        "score",
        help="write per-problem semantic entropy (resumable)",
        description="Sample N answers per problem, cluster them by math equivalence, and append one "
        "row per problem with its semantic entropy to --output. A re-run skips problems already there.",
    )
    add_model_arg(score)
    score.add_argument("--data", default="arithmetic", help="benchmark name or .jsonl/.parquet path")
    score.add_argument("--levels", type=int, nargs="+", default=[1], help="arithmetic levels")
    score.add_argument("--limit", type=int, default=0, help="score only the first N problems")
    score.add_argument("--n", type=int, default=8, help="answers sampled per problem (M)")
    score.add_argument(  # the training sampler's defaults: the entropy of the policy that will train
        "--temperature",
        type=float,
        default=DEFAULTS.rollout.temperature,
        help="sampling temperature (default %(default)s, as rollout.temperature)",
    )
    score.add_argument(
        "--top-p",
        type=float,
        default=DEFAULTS.rollout.top_p,
        help="nucleus sampling threshold (default %(default)s)",
    )
    score.add_argument(
        "--max-new-tokens",
        type=int,
        default=DEFAULTS.rollout.max_new_tokens,
        help="response budget (default %(default)s, as rollout.max_new_tokens)",
    )
    score.add_argument(
        "--estimator",
        choices=["length_normalized", "frequency"],
        default="length_normalized",
        help="cluster mass: exp(mean token log-prob) per answer, or answer counts",
    )
    score.add_argument(
        "--seed",
        type=int,
        default=DEFAULTS.trainer.seed,
        help="sampling seed; arithmetic problems use it too",
    )
    add_model_io_args(score)
    score.add_argument("--output", required=True, help="jsonl file to append to (data.curriculum)")
    score.add_argument("--quiet", action="store_true", help="no progress bar")
    score.set_defaults(func=run_score)


def run_score(args: argparse.Namespace) -> int:
    check_model_arg(args)
    import torch
    from tqdm.auto import tqdm

    from semrl.evaluation.difficulty import score_problems
    from semrl.reward import Judge
    from semrl.rollout.engines import SamplingParams

    if args.engine == "vllm" and args.estimator == "length_normalized":
        from semrl.config.engine_checks import check_unfiltered_logprobs

        check_unfiltered_logprobs(
            args.top_p,
            0,
            f"--engine vllm with --top-p {args.top_p}",
            "the length_normalized estimator reads them as the unfiltered distribution's",
            "use --top-p 1, --estimator frequency or --engine hf",
        )
    # the training problems of a run with trainer.seed
    found = problems(args.data, args, "train", seed=args.seed)
    sampler = load_sampler(args, found, args.max_new_tokens)
    params = SamplingParams(args.temperature, args.top_p, 0, args.max_new_tokens, logprobs_top_k=0)
    bar = tqdm(total=len(found), desc="score", disable=args.quiet)
    with cli_verifier_pool(args) as pool, bar:
        written = score_problems(
            sampler.engine,
            sampler.tokenizer,
            Judge(pool, not args.no_number_fallback),
            found,
            Path(args.output),
            params,
            args.n,
            sampler.prompt,
            args.estimator,
            torch.Generator().manual_seed(args.seed),
            bar.update,
        )
    print(f"{args.output}: {written} problems scored, {len(found) - written} already there")
    return 0
