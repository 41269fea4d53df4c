"""Command-line interface: ``semrl train``, ``semrl eval``, ``semrl config``, ``semrl curriculum``."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from semrl.config import ConfigError, config_reference, load_config


def _train(args: argparse.Namespace) -> int:
    from semrl.trainer import Trainer

    if args.resume:
        run_dir = Path(args.resume)
        cfg = load_config(args.config or run_dir / "config.yaml", args.overrides)
        cfg.logging.output_dir = str(run_dir)
    else:
        cfg = load_config(args.config, args.overrides)
    trainer = Trainer(cfg, resume=bool(args.resume))
    final = trainer.train()
    summary = {k: round(v, 4) for k, v in final.items() if k.startswith(("eval/", "reward", "accuracy"))}
    print(f"done: {cfg.logging.output_dir}  {json.dumps(summary)}")
    return 0


def _problems(args: argparse.Namespace, seed: int) -> list:
    from semrl.data import load_problems, resolve_dataset
    from semrl.data.arithmetic import make_arithmetic_problems

    if args.data == "arithmetic":
        problems = make_arithmetic_problems(args.limit or 64, args.levels, seed=seed)
    else:
        problems, _ = load_problems(resolve_dataset(args.data))
    return problems[: args.limit] if args.limit else problems


def _curriculum_score(args: argparse.Namespace) -> int:
    import torch
    from tqdm.auto import tqdm

    from semrl.curriculum import score_problems
    from semrl.models import load_model, load_tokenizer, resolve_model_path
    from semrl.reward import VerifierPool
    from semrl.rollout import RolloutEngine, SamplingParams

    problems = _problems(args, seed=args.seed)  # the training problems of a run with trainer.seed
    path = resolve_model_path(args.model)
    tokenizer, model = load_tokenizer(path), load_model(path)
    engine = RolloutEngine(model, [tokenizer.eos_token_id], tokenizer.pad_token_id, args.batch_size)
    params = SamplingParams(args.temperature, args.top_p, 0, args.max_new_tokens)
    system = None if args.no_system_prompt else args.system_prompt
    with VerifierPool(2, args.timeout) as pool, tqdm(total=len(problems), desc="score", disable=args.quiet) as bar:
        written = score_problems(
            engine, tokenizer, pool, problems, Path(args.output), params, args.n, system,
            not args.no_number_fallback, args.estimator, torch.Generator().manual_seed(args.seed), bar.update,
        )
    print(f"{args.output}: {written} problems scored, {len(problems) - written} already there")
    return 0


def _eval(args: argparse.Namespace) -> int:
    import torch
    from tqdm.auto import tqdm

    from semrl.evaluation import evaluate_problems
    from semrl.models import load_model, load_tokenizer, resolve_model_path
    from semrl.reward import VerifierPool
    from semrl.rollout import RolloutEngine, SamplingParams

    problems = _problems(args, seed=10_007)
    path = resolve_model_path(args.model)
    tokenizer = load_tokenizer(path)
    model = load_model(path)
    engine = RolloutEngine(model, [tokenizer.eos_token_id], tokenizer.pad_token_id, args.batch_size)
    system = None if args.no_system_prompt else args.system_prompt
    report: dict[str, dict[str, float]] = {}
    with VerifierPool(2, args.timeout) as pool:
        settings = [("greedy", 0.0, 1)] if args.greedy else []
        settings.append(("sampled", args.temperature, args.n))
        for name, temperature, n in settings:
            params = SamplingParams(temperature, args.top_p, 0, args.max_new_tokens)
            with tqdm(total=len(problems) * n, desc=f"eval {name}", disable=args.quiet) as bar:
                metrics, records = evaluate_problems(
                    engine, tokenizer, pool, problems, params, n, system, not args.no_number_fallback,
                    torch.Generator().manual_seed(args.seed), progress=bar.update,
                )
            report[name] = metrics
            if args.output:
                out = Path(args.output)
                out.mkdir(parents=True, exist_ok=True)
                with (out / f"samples_{name}.jsonl").open("w", encoding="utf-8") as fh:
                    for rec in records:
                        fh.write(json.dumps(rec) + "\n")
    text = json.dumps({"model": args.model, "data": args.data, "problems": len(problems), **report}, indent=2)
    if args.output:
        (Path(args.output) / "metrics.json").write_text(text)
    print(text)
    return 0


def _config(args: argparse.Namespace) -> int:
    if args.methods:
        from semrl.algos.registry import METHODS

        for name, spec in sorted(METHODS.items()):
            print(f"{name:14s} {spec.description}")
    elif args.check:
        cfg = load_config(args.check, args.overrides)
        print(f"{args.check}: OK (method {cfg.algorithm.method})")
    else:
        print(config_reference())
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="semrl",
        description="RL with verifiable rewards for LLM reasoning: GRPO, Dr.GRPO and "
        "semantic-entropy-guided methods, from a laptop CPU to a GPU cluster.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)

    train = sub.add_parser(
        "train",
        help="train a model",
        description="Train with a YAML config plus section.key=value overrides, e.g. "
        "'semrl train --config configs/demo.yaml trainer.lr=2e-6'.",
    )
    train.add_argument("--config", help="YAML config file (see 'semrl config' for every key)")
    train.add_argument("--resume", metavar="RUN_DIR", help="continue a run from its last checkpoint")
    train.add_argument("overrides", nargs="*", help="section.key=value overrides")
    train.set_defaults(func=_train)

    ev = sub.add_parser(
        "eval",
        help="evaluate a model or checkpoint on a dataset",
        description="Accuracy (greedy and sampled), unbiased pass@k and mean@k of a model on a "
        "dataset file, a packaged benchmark (math500, gsm8k_test, aime24, ...) or 'arithmetic'.",
    )
    ev.add_argument("--model", default="smollm2-135m", help="alias, model/checkpoint dir, .gguf or hub id")
    ev.add_argument("--data", default="arithmetic", help="benchmark name or .jsonl/.parquet path")
    ev.add_argument("--levels", type=int, nargs="+", default=[1], help="arithmetic levels")
    ev.add_argument("--limit", type=int, default=0, help="evaluate only the first N problems")
    ev.add_argument("--n", type=int, default=8, help="samples per problem (pass@k for k <= n)")
    ev.add_argument("--temperature", type=float, default=0.6, help="sampling temperature")
    ev.add_argument("--top-p", type=float, default=0.95, help="nucleus sampling threshold")
    ev.add_argument("--max-new-tokens", type=int, default=256, help="response budget")
    ev.add_argument("--greedy", action="store_true", help="also report greedy accuracy")
    ev.add_argument("--batch-size", type=int, default=64, help="generation batch size")
    ev.add_argument("--seed", type=int, default=0, help="sampling seed")
    ev.add_argument("--timeout", type=float, default=5.0, help="verification timeout per answer (s)")
    ev.add_argument(
        "--system-prompt",
        default="Please reason step by step, and put your final answer within \\boxed{}.",
        help="system message",
    )
    ev.add_argument("--no-system-prompt", action="store_true", help="use the template's default")
    ev.add_argument("--no-number-fallback", action="store_true", help="only \\boxed{} answers count")
    ev.add_argument("--output", help="directory for metrics.json and per-sample records")
    ev.add_argument("--quiet", action="store_true", help="no progress bar")
    ev.set_defaults(func=_eval)

    conf = sub.add_parser(
        "config", help="print the config reference or check a config file",
        description="Without arguments: every config key with type, default and meaning.",
    )
    conf.add_argument("--check", metavar="YAML", help="validate a config file (with overrides)")
    conf.add_argument("--methods", action="store_true", help="list the registered methods")
    conf.add_argument("overrides", nargs="*", help="section.key=value overrides")
    conf.set_defaults(func=_config)

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
    score.add_argument("--model", default="smollm2-135m", help="alias, model/checkpoint dir, .gguf or hub id")
    score.add_argument("--data", default="arithmetic", help="benchmark name or .jsonl/.parquet path")
    score.add_argument("--levels", type=int, nargs="+", default=[1], help="arithmetic levels")
    score.add_argument("--limit", type=int, default=0, help="score only the first N problems")
    score.add_argument("--n", type=int, default=8, help="answers sampled per problem (M)")
    score.add_argument("--temperature", type=float, default=1.0, help="sampling temperature")
    score.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling threshold")
    score.add_argument("--max-new-tokens", type=int, default=64, help="response budget")
    score.add_argument(
        "--estimator", choices=["length_normalized", "frequency"], default="length_normalized",
        help="cluster mass: exp(mean token log-prob) per answer, or answer counts",
    )
    score.add_argument("--batch-size", type=int, default=64, help="generation batch size")
    score.add_argument("--seed", type=int, default=0, help="sampling seed; arithmetic problems use it too")
    score.add_argument("--timeout", type=float, default=5.0, help="verification timeout per answer (s)")
    score.add_argument(
        "--system-prompt", default="Please reason step by step, and put your final answer within \\boxed{}.",
        help="system message of the chat template",
    )
    score.add_argument("--no-system-prompt", action="store_true", help="use the template's default")
    score.add_argument("--no-number-fallback", action="store_true", help="only \\boxed{} answers count")
    score.add_argument("--output", required=True, help="jsonl file to append to (data.curriculum)")
    score.add_argument("--quiet", action="store_true", help="no progress bar")
    score.set_defaults(func=_curriculum_score)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO, format="%(levelname)s %(name)s: %(message)s"
    )
    for noisy in ("transformers", "httpx", "huggingface_hub"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
    try:
        return args.func(args)
    except (ConfigError, FileNotFoundError, ValueError) as err:
        print(f"semrl: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
