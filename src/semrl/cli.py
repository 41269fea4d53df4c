"""Command-line interface: ``semrl train``, ``sweep``, ``eval``, ``report``, ``compare``, ``config``,
``checkpoint``, ``export``, ``curriculum``."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

from semrl.config import DEFAULT_SYSTEM_PROMPT, Config, ConfigError
from semrl.configure import config_reference, load_config
from semrl.errors import Preempted, TrainingError
from semrl.preemption import EXIT_PREEMPTED


def _launch(args: argparse.Namespace) -> int:
    """Re-run this ``semrl train`` command in ``args.num_processes`` processes through accelerate."""
    import subprocess

    if args.num_processes < 1:
        raise ConfigError(f"--num-processes must be >= 1, got {args.num_processes}")
    # a bad config fails here, once, instead of in every process
    load_config(args.config or (Path(args.resume) / "config.yaml" if args.resume else None), args.overrides)
    command = [
        sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu",
        "--num_processes", str(args.num_processes), "--num_machines", "1",
        "--mixed_precision", "no", "--dynamo_backend", "no", "-m", "semrl", "train",
    ]
    command += ["--config", args.config] if args.config else []
    command += ["--resume", args.resume] if args.resume else []
    command += [flag for plugin in args.plugin for flag in ("--plugin", plugin)]
    return subprocess.call(command + list(args.overrides))


def _train(args: argparse.Namespace) -> int:
    from semrl.run_summary import summary_of_run
    from semrl.trainer import Trainer

    if args.num_processes != 1:
        return _launch(args)
    if args.resume:
        run_dir = Path(args.resume)
        cfg = load_config(
            args.config or run_dir / "config.yaml", [*args.overrides, f"logging.output_dir={run_dir}"]
        )
    else:
        cfg = load_config(args.config, args.overrides)
    trainer = Trainer(cfg, resume=bool(args.resume))
    trainer.train()
    trainer.procs.close()
    if not trainer.procs.is_main:
        return 0
    print("\n" + summary_of_run(cfg.logging.output_dir))
    return 0


def _problems(name: str, args: argparse.Namespace, split: str, seed: int) -> list:
    """Problems of a packaged benchmark, a data file or 'arithmetic' (those of a run's ``split``
    with ``trainer.seed=seed``), cut to ``--limit``."""
    from semrl.data import load_dataset

    # type: ignore[arg-type]
    problems = load_dataset(
        name, split=split, seed=seed, arithmetic_size=args.limit or 64, levels=args.levels
    )
    return problems[: args.limit] if args.limit else problems


def _curriculum_score(args: argparse.Namespace) -> int:
    import torch
    from tqdm.auto import tqdm

    from semrl.curriculum import score_problems
    from semrl.data import build_prompt_ids
    from semrl.engines import SamplingParams
    from semrl.models import load_model, load_tokenizer, resolve_model_path
    from semrl.reward import VerifierPool

    if args.engine == "vllm" and args.top_p < 1.0 and args.estimator == "length_normalized":
        raise ConfigError(
            "--engine vllm with --top-p < 1: vLLM's log-probs "
            "are those of the filtered distribution, which the "
            "length_normalized estimator must not read "
            "(docs/engines.md); use --top-p 1, --estimator frequency or --engine hf"
        )
    # the training problems of a run with trainer.seed
    problems = _problems(args.data, args, "train", seed=args.seed)
    path = resolve_model_path(args.model)
    tokenizer, model = load_tokenizer(path), load_model(path)
    params = SamplingParams(args.temperature, args.top_p, 0, args.max_new_tokens, logprobs_top_k=0)
    system, template = _prompt_settings(args)
    prompts = [build_prompt_ids(tokenizer, p.problem, system, template) for p in problems]
    engine = _make_engine(args, model, tokenizer, prompts, args.max_new_tokens)
    with VerifierPool(2, args.timeout) as pool, tqdm(
        total=len(problems), desc="score", disable=args.quiet
    ) as bar:
        written = score_problems(
            engine, tokenizer, pool, problems, Path(args.output), params, args.n, system,
            not args.no_number_fallback, args.estimator, torch.Generator().manual_seed(args.seed), bar.update,
            prompt_template=template,
        )
    print(f"{args.output}: {written} problems scored, {len(problems) - written} already there")
    return 0


def _eval(args: argparse.Namespace) -> int:
    from tqdm.auto import tqdm

    from semrl.data import build_prompt_ids
    from semrl.evaluation import PRESETS, EvalSettings, evaluate_dataset, markdown_table
    from semrl.models import load_model, load_tokenizer, resolve_model_path
    from semrl.reward import VerifierPool

    preset = PRESETS[args.preset] if args.preset else {}
    n = args.n or preset.get("n", 8)
    temperature = args.temperature if args.temperature is not None else preset.get("temperature", 0.6)
    top_p = args.top_p if args.top_p is not None else preset.get("top_p", 0.95)
    max_new_tokens = args.max_new_tokens or preset.get("max_new_tokens", 256)
    datasets = {Path(d).stem if d.endswith((".jsonl", ".parquet")) else d: d for d in args.data}
    # fail early; arithmetic: the held-out problems of a run with trainer.seed=0
    problems = {name: _problems(source, args, "eval", seed=0) for name, source in datasets.items()}
    path = resolve_model_path(args.model)
    tokenizer, model = load_tokenizer(path), load_model(path)
    system, template = _prompt_settings(args)
    prompts = [
        build_prompt_ids(tokenizer, p.problem, system, template) for ps in problems.values() for p in ps
    ]
    engine = _make_engine(args, model, tokenizer, prompts, max_new_tokens)
    out = Path(args.output or Path("runs") / "eval" / Path(str(path)).name)
    summaries = {}
    with VerifierPool(2, args.timeout) as pool:
        for name, source in datasets.items():
            settings = EvalSettings(
                model=str(path), dataset=source, num_samples=n, temperature=temperature, top_p=top_p,
                max_new_tokens=max_new_tokens, seed=args.seed, system_prompt=system, prompt_template=template,
                final_number_fallback=not args.no_number_fallback,
                problems_per_chunk=max(1, args.batch_size // n), batch_size=args.batch_size,
            )
            with tqdm(
                total=len(problems[name]), desc=f"eval {name}", unit="problem", disable=args.quiet
            ) as bar:
                summaries[name], reused = evaluate_dataset(
                    engine, tokenizer, pool, problems[name], settings, out / name, bar.update
                )
            if reused:
                print(f"{name}: reused {reused} problems already in {out / name / 'problems.jsonl'}")
    table = markdown_table(summaries)
    (out / "metrics.json").write_text(json.dumps(summaries, indent=2))
    (out / "results.md").write_text(f"# {args.model}: n={n}, T={temperature}, top_p={top_p}\n\n{table}\n")
    print(table)
    print(f"written: {out / 'metrics.json'}, {out / 'results.md'}")
    return 0


def _report(args: argparse.Namespace) -> int:
    from semrl.report import write_report

    index = write_report(args.run_dir, args.output)
    print(f"report: {index}  (open it in a browser; figures in {index.parent / 'figures'})")
    return 0


def _compare(args: argparse.Namespace) -> int:
    from semrl.report import compare_runs
    from semrl.report.seeds import compare_seeds

    sweep_dir = len(args.run_dirs) == 1 and not (Path(args.run_dirs[0]) / "metrics.jsonl").exists()
    if args.group_by or sweep_dir:
        print(
            compare_seeds(
                args.run_dirs, args.output, args.group_by, args.baseline, args.metric, args.x_axis,
                args.window,
            )
        )
    elif args.baseline:
        raise ConfigError(
            "--baseline compares variants across seeds: give a sweep directory or --group-by KEY"
        )
    else:
        print(compare_runs(args.run_dirs, args.metric, args.output))
    return 0


def _sweep(args: argparse.Namespace) -> int:
    from semrl import sweep as sweeps

    sweep = sweeps.load_sweep(args.sweep_file)
    if args.dry_run:
        print(sweeps.dry_run(sweep))
        return 0
    if args.launcher == "local":
        return sweeps.run_local(sweep)
    options = {
        "partition": args.partition, "gpus_per_node": args.gpus_per_node, "cpus_per_task": args.cpus_per_task,
        "timeout_min": args.timeout_min, "array_parallelism": args.array_parallelism, "account": args.account,
    }
    folder = sweep.output_dir / ".submitit"
    cluster = "slurm" if args.launcher == "slurm" else "local"
    executor = sweeps.slurm_executor(sweep, folder, options, cluster=cluster)
    jobs = sweeps.submit(sweep, executor, wait=args.wait or cluster == "local")
    print(f"{len(jobs)} job(s) submitted; logs in {folder}. Run the same command again to see what is done "
          "and submit what is left.")
    return 0


def _config(args: argparse.Namespace) -> int:
    if args.methods:
        from semrl.configure import methods_table

        print(methods_table())
    elif args.check:
        cfg = load_config(args.check, args.overrides)
        print(f"{args.check}: OK (method {cfg.algorithm.method})")
    else:
        print(config_reference())
    return 0


def _checkpoint(args: argparse.Namespace) -> int:
    from semrl.checkpoint import (
        convert_legacy_checkpoints,
        list_checkpoints,
        stage_reference_dirs,
        verify_checkpoint,
    )

    run_dir = Path(args.run_dir)
    if args.checkpoint_command == "convert":
        converted = convert_legacy_checkpoints(run_dir)
        print(f"converted {len(converted)} checkpoint(s)" + "".join(f"\n  {c}" for c in converted))
        return 0
    references = [c for stage in stage_reference_dirs(run_dir) for c in list_checkpoints(stage)]
    found = list_checkpoints(run_dir) + references
    if not found:
        raise ConfigError(f"no checkpoints in {run_dir / 'checkpoints'}")
    bad = 0
    for ckpt in found:
        problems = verify_checkpoint(ckpt)
        bad += bool(problems)
        print(f"{ckpt}: " + ("OK" if not problems else "DAMAGED\n    " + "\n    ".join(problems)))
    print(f"{len(found) - bad} of {len(found)} checkpoints valid")
    return 1 if bad else 0


def _export(args: argparse.Namespace) -> int:
    from semrl.export import export_model

    run_dir = Path(args.run_dir)
    output = export_model(
        run_dir, Path(args.output) if args.output else None,
        Path(args.checkpoint) if args.checkpoint else None
    )
    print(f"wrote {output} (load it with AutoModelForCausalLM.from_pretrained)")
    return 0


# Defaults the config defines too are taken from it, so that a command and a run agree
DEFAULTS = Config()


def _add_model_io_args(parser: argparse.ArgumentParser) -> None:
    """Options shared by the commands that sample from a model and verify its answers."""
    parser.add_argument(
        "--batch-size", type=int, default=DEFAULTS.rollout.generation_batch_size,
        help="generation batch size (default %(default)s, as rollout.generation_batch_size)",
    )
    parser.add_argument(
        "--timeout", type=float, default=DEFAULTS.reward.timeout_s,
        help="verification timeout per answer in seconds (default %(default)s, as reward.timeout_s)",
    )
    parser.add_argument(
        "--system-prompt",
        help="system message of the chat template (default: the training run's when --model is "
        "one of its checkpoints, else semrl's default)",
    )
    parser.add_argument("--no-system-prompt", action="store_true", help="use the template's default")
    parser.add_argument(
        "--prompt-template", metavar="TEXT",
        help="plain-text prompt with a {problem} field instead of the chat template, as data.prompt_template "
        "(default: the training run's when --model is one of its checkpoints)",
    )
    parser.add_argument("--no-number-fallback", action="store_true", help="only \\boxed{} answers count")
    parser.add_argument(
        "--engine", choices=["hf", "vllm"], default="hf",
        help="sampling engine: hf (transformers, the reference) or vllm (pip install -e '.[vllm]'); "
        "docs/engines.md",
    )
    parser.add_argument(
        "--kv-cache-gib", type=float, default=DEFAULTS.rollout.vllm_kv_cache_gib,
        help="vllm on CPU: KV-cache size in GiB (default %(default)s, as rollout.vllm_kv_cache_gib)",
    )


def _add_plugin_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--plugin", action="append", default=[], metavar="MODULE",
        help="a module of your own that registers methods or losses: a .py file or an importable name "
        "(repeatable; docs/methods/adding.md)",
    )


def _prompt_settings(args: argparse.Namespace) -> tuple[str | None, str | None]:
    """(system prompt, prompt template) as training used them: explicit flags first, then the
    config of the run whose checkpoint ``--model`` names, then the defaults."""
    run_config = Path(args.model).parent.parent / "config.yaml"
    data: dict[str, Any] = {}
    if run_config.is_file() and Path(args.model).parent.name == "checkpoints":
        import yaml

        data = (yaml.safe_load(run_config.read_text(encoding="utf-8")) or {}).get("data") or {}
    system = args.system_prompt if args.system_prompt is not None else data.get(
        "system_prompt", DEFAULT_SYSTEM_PROMPT
    )
    template = args.prompt_template if args.prompt_template is not None else data.get("prompt_template")
    if template is not None and (not isinstance(template, str) or "{problem}" not in template):
        raise ConfigError(f"--prompt-template must contain a {{problem}} field, got {template!r}")
    return (None if args.no_system_prompt else system), template


def _make_engine(
    args: argparse.Namespace, model: Any, tokenizer: Any, prompts: list[list[int]], max_new_tokens: int
) -> Any:
    """The engine of ``--engine`` for these prompts (vllm sizes its cache by the longest)."""
    from dataclasses import replace

    from semrl.engines import build_engine

    # the rollout section's vllm defaults; no sleep mode: nothing trains between the calls
    options = replace(DEFAULTS.rollout, vllm_kv_cache_gib=args.kv_cache_gib, vllm_sleep=False)
    longest = max((len(p) for p in prompts), default=0)
    return build_engine(
        args.engine, model, tokenizer, args.batch_size, longest + max_new_tokens, seed=args.seed,
        vllm_options=options,
    )


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("semrl")
    except PackageNotFoundError:  # run from a source tree that is not installed
        from semrl import __version__

        return __version__


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="semrl",
        description="RL with verifiable rewards for LLM reasoning: GRPO, Dr.GRPO and "
        "semantic-entropy-guided methods, from a laptop CPU to a GPU cluster.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)

    train = sub.add_parser(
        "train",
        help="train a model",
        description="Train with a YAML config plus section.key=value overrides, e.g. "
        "'semrl train --config configs/demo.yaml trainer.lr=2e-6'.",
    )
    train.add_argument("--config", help="YAML config file (see 'semrl config' for every key)")
    train.add_argument("--resume", metavar="RUN_DIR", help="continue a run from its last checkpoint")
    train.add_argument(
        "--num-processes", type=int, default=1, metavar="N",
        help="data-parallel processes on this machine, started through 'accelerate launch' (gloo on CPU, "
        "NCCL on GPUs); the same as 'accelerate launch --multi_gpu --num_processes N -m semrl train ...'",
    )
    _add_plugin_arg(train)
    train.add_argument("overrides", nargs="*", help="section.key=value overrides")
    train.set_defaults(func=_train)

    ev = sub.add_parser(
        "eval",
        help="evaluate a model or checkpoint on a dataset",
        description="n samples per problem on one or more datasets: unbiased pass@k, mean@k and maj@k "
        "for every k <= n, response length (all, correct), distinct answers, accuracy by level and "
        "subject, verification time-outs. Writes JSON and a Markdown table; resumable.",
    )
    ev.add_argument(
        "--model", default=DEFAULTS.model.name,
        help="alias, model/checkpoint dir, .gguf or hub id (default %(default)s)"
    )
    ev.add_argument(
        "--data", nargs="+", default=["arithmetic"],
        help="benchmark names (math500 aime24 aime25 amc23 gsm8k_test minerva_math olympiadbench ...), "
        ".jsonl/.parquet files in the same schema, or 'arithmetic'",
    )
    ev.add_argument(
        "--preset", choices=["rose", "sent", "greedy", "aime64"],
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
    _add_model_io_args(ev)
    ev.add_argument(
        "--output",
        help="directory (default runs/eval/MODEL): DATASET/problems.jsonl per dataset, metrics.json, "
        "results.md. A re-run with the same settings reuses the problems already there",
    )
    ev.add_argument("--quiet", action="store_true", help="no progress bar")
    ev.set_defaults(func=_eval)

    rep = sub.add_parser(
        "report", help="write a run's HTML report",
        description="A self-contained HTML page (no server, no network) with training and evaluation "
        "curves, evaluation tables and the reasoning-tree viewer, plus PNG curves (with matplotlib).",
    )
    rep.add_argument("run_dir", help="run directory (logging.output_dir)")
    rep.add_argument("--output", help="directory for index.html and figures/ (default RUN_DIR/report)")
    rep.set_defaults(func=_report)

    cmp = sub.add_parser(
        "compare", help="compare runs side by side, or variants across seeds",
        description="Run directories: final metrics side by side and per-step tables (Markdown), and with "
        "--output one PNG per metric with all runs overlaid. A sweep directory (OUT/VARIANT/seed-S) or "
        "--group-by KEY: each variant's seeds aggregated (mean +- s.e. per step and at the end, pass@k for "
        "k = 1..n beside the base model's; paired differences at the seed level against --baseline, or "
        "between every pair: a 95 percent t-interval over the per-seed differences, how many seeds agree, "
        "the smallest difference detectable at 80 percent power and the seeds the observed one would need; "
        "at equal steps and at equal sampled tokens); with --output also results.md, aggregate.json, PNG "
        "figures and index.html (docs/sweeps.md, docs/evaluation.md).",
    )
    cmp.add_argument("run_dirs", nargs="+", help="run directories, or one sweep directory")
    cmp.add_argument("--metric", nargs="+", help="metrics (default: reward, accuracy, entropy, ..., eval)")
    cmp.add_argument("--output", help="directory for the tables and PNG plots")
    cmp.add_argument(
        "--group-by", metavar="KEY",
        help="config key whose value names a run's variant, e.g. algorithm.method"
    )
    cmp.add_argument(
        "--baseline", metavar="VARIANT",
        help="variant the others are compared with, paired by seed (default: every pair)"
    )
    cmp.add_argument(
        "--x-axis", choices=["step", "tokens"], default="step",
        help="x axis of the per-step figures: training step, or cumulative sampled tokens (default step)",
    )
    cmp.add_argument(
        "--window", type=int, default=1, metavar="N",
        help="compare training metrics (entropy, accuracy, ...) as their mean over each run's last N steps "
        "(default 1: the last step)",
    )
    cmp.set_defaults(func=_compare)

    sw = sub.add_parser(
        "sweep", help="run a grid of variants x seeds (a multi-seed study)",
        description="A base config, named variants (sets of overrides) and seeds from one YAML file "
        "(docs/sweeps.md); each run goes to OUTPUT_DIR/VARIANT/seed-S. Finished runs are skipped and "
        "interrupted ones resumed, so running the same command again continues a study. Compare the "
        "variants across seeds with 'semrl compare OUTPUT_DIR'.",
    )
    sw.add_argument("sweep_file", help="sweep YAML file")
    sw.add_argument(
        "--dry-run", action="store_true", help="list the runs, their state and commands; run nothing"
    )
    sw.add_argument(
        "--launcher", choices=["local", "slurm", "submitit-local"], default="local",
        help="local: one run after another here (default); slurm: one job per run through submitit "
        "(pip install 'semrl[slurm]'); submitit-local: submitit's local executor, to try the job path here",
    )
    sw.add_argument("--partition", help="slurm partition")
    sw.add_argument("--account", help="slurm account")
    sw.add_argument("--gpus-per-node", type=int, help="GPUs per job")
    sw.add_argument("--cpus-per-task", type=int, help="CPUs per job")
    sw.add_argument("--timeout-min", type=int, help="time limit per job in minutes (default 240)")
    sw.add_argument("--array-parallelism", type=int, help="jobs of the array running at once")
    sw.add_argument("--wait", action="store_true", help="slurm: wait for every job to end")
    sw.set_defaults(func=_sweep)

    conf = sub.add_parser(
        "config", help="print the config reference or check a config file",
        description="Without arguments: every config key with type, default and meaning.",
    )
    conf.add_argument("--check", metavar="YAML", help="validate a config file (with overrides)")
    conf.add_argument("--methods", action="store_true", help="list the registered methods")
    _add_plugin_arg(conf)
    conf.add_argument("overrides", nargs="*", help="section.key=value overrides")
    conf.set_defaults(func=_config)

    ck = sub.add_parser(
        "checkpoint", help="verify or convert a run's checkpoints",
        description="verify: check every checkpoint of a run (and its curriculum references) against its "
        "manifest (file sizes and SHA-256); exit 1 if one is damaged. convert: rewrite checkpoints written "
        "by an older semrl (trainer_state.pt, a pickle) in the safe format; only for checkpoints you trust.",
    )
    ck.add_argument("checkpoint_command", choices=["verify", "convert"])
    ck.add_argument("run_dir", help="run directory (logging.output_dir)")
    ck.set_defaults(func=_checkpoint)

    ex = sub.add_parser(
        "export", help="write a run's trained model as one Hugging Face model directory",
        description="The newest valid checkpoint (or --checkpoint) as a directory that "
        "AutoModelForCausalLM.from_pretrained loads: LoRA adapters merged into the run's base model, "
        "no trainer state.",
    )
    ex.add_argument("run_dir", help="run directory (logging.output_dir)")
    ex.add_argument("--checkpoint", help="checkpoint directory (default: the newest valid one of RUN_DIR)")
    ex.add_argument("--output", help="a new directory (default RUN_DIR/export)")
    ex.set_defaults(func=_export)

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
    score.add_argument(
        "--model", default=DEFAULTS.model.name,
        help="alias, model/checkpoint dir, .gguf or hub id (default %(default)s)"
    )
    score.add_argument("--data", default="arithmetic", help="benchmark name or .jsonl/.parquet path")
    score.add_argument("--levels", type=int, nargs="+", default=[1], help="arithmetic levels")
    score.add_argument("--limit", type=int, default=0, help="score only the first N problems")
    score.add_argument("--n", type=int, default=8, help="answers sampled per problem (M)")
    score.add_argument(  # the training sampler's defaults: the entropy of the policy that will train
        "--temperature", type=float, default=DEFAULTS.rollout.temperature,
        help="sampling temperature (default %(default)s, as rollout.temperature)",
    )
    score.add_argument(
        "--top-p", type=float, default=DEFAULTS.rollout.top_p,
        help="nucleus sampling threshold (default %(default)s)"
    )
    score.add_argument(
        "--max-new-tokens", type=int, default=DEFAULTS.rollout.max_new_tokens,
        help="response budget (default %(default)s, as rollout.max_new_tokens)",
    )
    score.add_argument(
        "--estimator", choices=["length_normalized", "frequency"], default="length_normalized",
        help="cluster mass: exp(mean token log-prob) per answer, or answer counts",
    )
    score.add_argument(
        "--seed", type=int, default=DEFAULTS.trainer.seed,
        help="sampling seed; arithmetic problems use it too"
    )
    _add_model_io_args(score)
    score.add_argument("--output", required=True, help="jsonl file to append to (data.curriculum)")
    score.add_argument("--quiet", action="store_true", help="no progress bar")
    score.set_defaults(func=_curriculum_score)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO, format="%(levelname)s %(name)s: %(message)s"
    )
    for noisy in ("transformers", "httpx", "huggingface_hub", "vllm"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
    try:
        if getattr(args, "plugin", None):
            from semrl.algos.catalog import load_plugins

            load_plugins(args.plugin)
        return args.func(args)
    except (ConfigError, FileNotFoundError, ValueError) as err:
        print(f"semrl: error: {err}", file=sys.stderr)
        return 2
    except Preempted as err:
        print(f"semrl: preempted: {err}", file=sys.stderr)
        return EXIT_PREEMPTED
    except TrainingError as err:
        print(f"semrl: stopped: {err}", file=sys.stderr)
        return 3


if __name__ == "__main__":
    sys.exit(main())
