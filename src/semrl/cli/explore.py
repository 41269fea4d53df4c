"""``semrl explore``: rollout methods against independent sampling at equal sampled tokens, at a
fixed policy, with problems as the unit (``semrl.studies.explore``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from semrl.cli.common import SubParsers, add_plugin_arg, load_plugins_of
from semrl.errors import ConfigError


def add_parser(sub: SubParsers) -> None:
    ex = sub.add_parser(
        "explore",
        help="compare rollout methods with independent sampling at equal cost, per problem",
        description="At the config's policy (model.name, a checkpoint too), every method rolls out every "
        "problem (rollout.group_size leaves, the method's own config section), independent sampling "
        "draws --independent-samples responses per problem, and each leaf is verified and its answer "
        "clustered. Per problem, each method is compared with independent sampling at the same sampled "
        "tokens: solved, distinct answers, distinct correct answers (docs/evaluation.md, 'Exploration "
        "at equal cost'). Writes records.jsonl (resumable), summary.json and results.md.",
    )
    ex.add_argument("--config", help="a config file or packaged name (demo, rose_paper, ...)")
    ex.add_argument(
        "--methods",
        nargs="+",
        default=None,
        help="rollout methods (default: every registered method with its own rollout: fr3e latr rose "
        "treepo, and a plug-in's)",
    )
    ex.add_argument("--seeds", type=int, nargs="+", default=[0], help="rollout seeds per method (default 0)")
    ex.add_argument(
        "--data",
        default="arithmetic",
        help="benchmark name or .jsonl/.parquet file; arithmetic: the held-out problems",
    )
    ex.add_argument("--limit", type=int, default=0, help="only the first N problems")
    ex.add_argument(
        "--independent-samples",
        type=int,
        default=0,
        help="independent responses per problem, the equal-cost reference (default 2 x rollout.group_size); "
        "a tree that spends more than that many responses' tokens on a problem is refused",
    )
    ex.add_argument(
        "--batch-problems",
        type=int,
        default=32,
        help="problems per engine call (default %(default)s); a problem's records do not "
        "depend on it, except LATR's finishing samples",
    )
    ex.add_argument(
        "--output", help="directory (default runs/explore-YYYYMMDD-HHMMSS); a re-run continues it"
    )
    ex.add_argument(
        "--decide",
        metavar="RULES",
        help="a rules file with a design whose looks count problems; pairs name methods or 'independent', "
        "metrics are solved, distinct_answers or distinct_correct (docs/evaluation.md)",
    )
    add_plugin_arg(ex)
    ex.add_argument("overrides", nargs="*", help="section.key=value overrides")
    ex.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    load_plugins_of(args)
    from semrl.config.load import fresh_run_dir, load_config
    from semrl.data import load_dataset
    from semrl.methods.catalog import get_method, tree_methods

    cfg = load_config(args.config, args.overrides)
    rules = None
    if args.decide:
        from semrl.studies.rules_file import load_rules

        rules = load_rules(args.decide)  # a bad rules file fails before the model loads
    args.methods = args.methods or tree_methods()
    for name in args.methods:
        if get_method(name).rollout_fn is None:
            raise ConfigError(
                f"--methods: {name} samples its groups independently; independent sampling is the reference "
                f"every method is compared with. Name tree methods ({', '.join(tree_methods())})"
            )
    leaves = cfg.rollout.group_size
    independent = args.independent_samples or 2 * leaves
    if independent < 2:
        raise ConfigError(f"--independent-samples must be >= 2, got {independent}")
    problems = load_dataset(
        args.data,
        split="eval",
        seed=cfg.trainer.seed,
        arithmetic_size=args.limit or 64,
        levels=cfg.data.arithmetic_levels,
    )
    problems = problems[: args.limit] if args.limit else problems
    out = Path(args.output or fresh_run_dir("explore"))
    import torch

    from semrl.data import PromptFormat
    from semrl.models.loading import load_model, load_tokenizer, resolve_model_path
    from semrl.rollout.engines import build_engine
    from semrl.studies.explore_run import run_exploration
    from semrl.studies.explore_summary import summary_table, write_summary

    path = resolve_model_path(cfg.model.name, cfg.model.cache_dir)
    tokenizer, model = load_tokenizer(path), load_model(path)
    prompt = PromptFormat.of(cfg.data)
    longest = max(len(prompt.ids(tokenizer, p.problem)) for p in problems)
    engine = build_engine(
        cfg.rollout.engine,
        model,
        tokenizer,
        cfg.rollout.generation_batch_size,
        longest + cfg.rollout.max_new_tokens,
        cfg.rollout.logprobs_top_k,
        seed=cfg.trainer.seed,
        vllm_options=cfg.rollout,
    )
    print(
        f"exploration into {out}: {len(problems)} problems, methods {', '.join(args.methods)}, seeds "
        f"{args.seeds}, {leaves} leaves per rollout, {independent} independent samples per problem",
        flush=True,
    )
    with torch.no_grad():
        records = run_exploration(
            cfg,
            args.methods,
            args.seeds,
            problems,
            independent,
            out,
            engine,
            model,
            tokenizer,
            progress=lambda line: print(line, flush=True),
            batch_problems=args.batch_problems,
        )
    summary = write_summary(out, records)
    print(summary_table(summary))
    if rules is not None:
        from semrl.studies.explore_summary import judge_exploration
        from semrl.studies.tables import markdown_lines

        heading, rows, _ = judge_exploration(records, rules, out)
        table = "\n".join(markdown_lines(rows[0], rows[1:]))
        (out / "decisions.md").write_text(f"{heading}\n\n{table}\n", encoding="utf-8")
        print(f"\n{heading}\n\n{table}")
    print(f"written: {out / 'records.jsonl'}, {out / 'summary.json'}, {out / 'results.md'}")
    return 0
