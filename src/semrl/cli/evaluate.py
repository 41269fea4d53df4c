"""``semrl eval``: pass@k, mean@k and maj@k of a model or checkpoint on one or more datasets."""

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
    ev = sub.add_parser(
        "eval",
        help="evaluate a model or checkpoint on a dataset",
        description="n samples per problem on one or more datasets: unbiased pass@k, mean@k and maj@k "
        "for every k <= n, response length (all, correct), distinct answers, accuracy by level and "
        "subject, verification time-outs. Writes JSON and a Markdown table; resumable.",
    )
    add_model_arg(ev)
    ev.add_argument(
        "--data",
        nargs="+",
        default=["arithmetic"],
        help="benchmark names (math500 aime24 aime25 amc23 gsm8k_test minerva_math olympiadbench ...), "
        ".jsonl/.parquet files in the same schema, or 'arithmetic'",
    )
    ev.add_argument(
        "--preset",
        choices=["rose", "sent", "greedy", "aime64"],
        help="papers' sampling settings: rose = n 8, T 0.6, top_p 0.95, 4096 tokens; sent = n 1, T 1.0, "
        "top_p 0.6; greedy = n 1, T 0; aime64 = n 64, T 0.6. Explicit flags override it",
    )
    ev.add_argument("--levels", type=int, nargs="+", default=[1], help="arithmetic levels")
    ev.add_argument("--limit", type=int, default=0, help="evaluate only the first N problems of each dataset")
    ev.add_argument(
        "--n", type=int, default=0, help="samples per problem, pass@k for every k <= n (default 8)"
    )
    ev.add_argument("--temperature", type=float, help="sampling temperature, 0 = greedy (default 0.6)")
    ev.add_argument("--top-p", type=float, help="nucleus sampling threshold (default 0.95)")
    ev.add_argument("--max-new-tokens", type=int, default=0, help="response budget (default 256)")
    ev.add_argument(
        "--seed", type=int, default=DEFAULTS.trainer.seed, help="sampling seed (default %(default)s)"
    )
    add_model_io_args(ev)
    ev.add_argument(
        "--output",
        help="directory (default runs/eval/MODEL; runs/eval/RUN-step-N for a run's checkpoint): "
        "DATASET/problems.jsonl per dataset, metrics.json, "
        "results.md. A re-run with the same settings reuses the problems already there",
    )
    ev.add_argument("--quiet", action="store_true", help="no progress bar")
    ev.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    check_model_arg(args)
    datasets = {Path(d).stem if d.endswith((".jsonl", ".parquet")) else d: d for d in args.data}
    # The problems load before torch does, so that a missing file fails at once. For arithmetic they
    # are the held-out problems of a run with trainer.seed=0.
    found = {name: problems(source, args, "eval", seed=0) for name, source in datasets.items()}
    from semrl.evaluation import PRESETS, EvalSettings, evaluate_datasets, markdown_table

    preset = PRESETS[args.preset] if args.preset else {}
    n = args.n or preset.get("n", 8)
    temperature = args.temperature if args.temperature is not None else preset.get("temperature", 0.6)
    top_p = args.top_p if args.top_p is not None else preset.get("top_p", 0.95)
    max_new_tokens = args.max_new_tokens or preset.get("max_new_tokens", 256)
    sampler = load_sampler(args, [p for ps in found.values() for p in ps], max_new_tokens)
    path, system, template = sampler.model_path, sampler.prompt.system_prompt, sampler.prompt.template
    out = Path(args.output or Path("runs") / "eval" / default_output_name(path))
    settings = {
        name: EvalSettings(
            model=path,
            dataset=source,
            num_samples=n,
            temperature=temperature,
            top_p=top_p,
            max_new_tokens=max_new_tokens,
            seed=args.seed,
            system_prompt=system,
            prompt_template=template,
            final_number_fallback=not args.no_number_fallback,
            numeral_answers=not args.expressions_as_answers,
            refuse_restatements=not args.expressions_as_answers,
            problems_per_chunk=max(1, args.batch_size // n),
            batch_size=args.batch_size,
        )
        for name, source in datasets.items()
    }
    with cli_verifier_pool(args) as pool:
        summaries, reused = evaluate_datasets(
            sampler.engine,
            sampler.tokenizer,
            pool,
            found,
            settings,
            out,
            f"{args.model}: n={n}, T={temperature}, top_p={top_p}",
            quiet=args.quiet,
        )
    for name, count in reused.items():
        if count:
            print(f"{name}: reused {count} problems already in {out / name / 'problems.jsonl'}")
    print(markdown_table(summaries))
    print(f"written: {out / 'metrics.json'}, {out / 'results.md'}")
    return 0


def default_output_name(model_path: str) -> str:
    """The name of ``semrl eval``'s default output directory: a run's checkpoint is named after its run
    (``runs/A/checkpoints/step-000010`` -> ``A-step-000010``), so that two runs' checkpoints of one
    step do not share a directory; another model after its own name. A path that exists is read
    whole, so ``checkpoints/step-000010`` given from inside run A is A's too."""
    path = Path(model_path).expanduser()
    if path.exists():
        path = path.resolve()
    if path.parent.name == "checkpoints" and path.parent.parent.name:
        return f"{path.parent.parent.name}-{path.name}"
    return path.name
