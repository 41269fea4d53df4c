"""LoRA (model.lora_*): only adapters train, the reference is the base, merged weights, exact resume, export."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from semrl.cli import main
from semrl.config.load import load_config
from semrl.config.sections import ConfigError
from semrl.models.loading import load_model
from semrl.models.lora import adapters_disabled, add_adapters, sampling_weights
from semrl.rollout.sequences import make_sequence_batch
from semrl.runtime.trainer import Trainer
from semrl.update.forward import response_logprobs
from tests.helpers import read_metrics, tiny_run_config, write_seven_task

LORA = ["model.lora_r=16", "model.lora_alpha=32", "trainer.lr=3e-3", "algorithm.method=grpo"]


def _random_batch(generator, n=5, vocab=1000):
    prompts = [
        torch.randint(
            1, vocab, (int(torch.randint(2, 9, (1,), generator=generator)),), generator=generator
        ).tolist()
        for _ in range(n)
    ]
    responses = [
        torch.randint(
            1, vocab, (int(torch.randint(1, 7, (1,), generator=generator)),), generator=generator
        ).tolist()
        for _ in range(n)
    ]
    return make_sequence_batch(prompts, responses, 0)


def _logprobs(model, batch):
    with torch.no_grad():
        return response_logprobs(model, batch, 1.0, with_entropy=False)[0]


@pytest.fixture(scope="module")
def lora_run(digit_model_dir, tmp_path_factory):
    """A 20-step LoRA run on the seven task with a KL term (so the reference pass runs)."""
    root = tmp_path_factory.mktemp("lora")
    task = write_seven_task(root / "seven.jsonl")
    out = root / "run"
    cfg = tiny_run_config(
        digit_model_dir,
        task,
        out,
        *LORA,
        "trainer.steps=20",
        "rollout.prompts_per_step=8",
        "algorithm.kl_coef=0.01",
    )
    trainer = Trainer(cfg)
    trainer.train()
    return trainer, out


def test_lora_learns_and_only_the_adapters_change(lora_run, digit_model_dir):
    trainer, out = lora_run
    rewards = [m["reward"] for m in read_metrics(out)]
    assert len(rewards) == 20
    first, last = sum(rewards[:4]) / 4, sum(rewards[-4:]) / 4
    assert last > first + 0.08, rewards
    assert all(m["kl"] >= 0 for m in read_metrics(out)) and read_metrics(out)[-1]["kl"] > 0
    base = load_file(digit_model_dir / "model.safetensors")
    trained = trainer.models.model.state_dict()
    adapters = {k: v for k, v in trained.items() if ".lora_" in k}
    assert adapters and all(
        ".lora_" in n for n, p in trainer.models.model.named_parameters() if p.requires_grad
    )
    assert all(v.abs().max() > 0 for k, v in adapters.items() if ".lora_B." in k)  # B starts at 0
    for key, value in trained.items():
        if ".lora_" not in key:
            name = key.replace(".base_layer.", ".")
            assert torch.equal(value, base.get(name, base.get("model.embed_tokens.weight"))), key
    ckpt = out / "checkpoints" / "step-000020"
    assert (ckpt / "adapter_model.safetensors").is_file() and not (ckpt / "model.safetensors").exists()
    # the optimizer holds state for the adapters only
    assert len(trainer.run.optim.optimizer.state) == len(adapters)


def test_the_reference_is_the_base_with_adapters_off(lora_run, digit_model_dir):
    trainer, _ = lora_run
    model = trainer.models.model
    assert trainer.models.ref_model is model  # no second copy
    base = load_model(str(digit_model_dir))
    batch = _random_batch(torch.Generator().manual_seed(0))
    with trainer.models.reference_weights():
        reference = _logprobs(model, batch)
    torch.testing.assert_close(reference, _logprobs(base, batch), atol=1e-6, rtol=0)
    assert (_logprobs(model, batch) - reference).abs().max() > 1e-3  # adapters on again
    assert all((".lora_" in n) == p.requires_grad for n, p in model.named_parameters())


@pytest.mark.parametrize(
    ("rank", "alpha", "targets"),
    [
        (1, 1.0, ["all-linear"]),
        (4, 16.0, ["q_proj", "v_proj"]),
        (8, 3.0, ["down_proj", "o_proj"]),
        (2, 64.0, ["all-linear"]),
    ],
)
def test_merged_weights_equal_peft_merge_and_the_adapted_model(
    digit_model_dir, tmp_path, rank, alpha, targets
):
    from peft import PeftModel

    model = load_model(str(digit_model_dir))
    overrides = [
        f"model.lora_r={rank}",
        f"model.lora_alpha={alpha}",
        f"model.lora_target_modules=[{','.join(targets)}]",
    ]
    add_adapters(model, load_config(None, overrides).model)
    generator = torch.Generator().manual_seed(rank)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".lora_" in name:
                p.copy_(torch.randn(p.shape, generator=generator) * 0.3)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    merged = dict(sampling_weights(model))
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # left unchanged
    reference = PeftModel.from_pretrained(
        load_model(str(digit_model_dir)), _save_adapters(model, tmp_path / "adapters")
    ).merge_and_unload()
    expected = reference.state_dict()
    assert merged.keys() == expected.keys()
    for key in expected:
        torch.testing.assert_close(merged[key], expected[key], atol=1e-6, rtol=1e-6)
    plain = load_model(str(digit_model_dir))
    plain.load_state_dict(merged)
    batch = _random_batch(generator)
    torch.testing.assert_close(_logprobs(plain, batch), _logprobs(model, batch), atol=1e-5, rtol=0)
    with adapters_disabled(model):
        torch.testing.assert_close(
            _logprobs(model, batch), _logprobs(load_model(str(digit_model_dir)), batch)
        )


def _save_adapters(model, path):
    model.save_pretrained(path)
    return str(path)


def test_lora_resume_is_exact(digit_model_dir, seven_task, tmp_path):
    extra = [*LORA, "algorithm.kl_coef=0.01"]
    full = tmp_path / "full"
    Trainer(tiny_run_config(digit_model_dir, seven_task, full, *extra, "trainer.steps=4")).train()
    part = tmp_path / "part"
    Trainer(tiny_run_config(digit_model_dir, seven_task, part, *extra, "trainer.steps=2")).train()
    assert main(["train", "--resume", str(part), "trainer.steps=4", "logging.progress=false"]) == 0
    a = load_file(full / "checkpoints" / "step-000004" / "adapter_model.safetensors")
    b = load_file(part / "checkpoints" / "step-000004" / "adapter_model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    keys = ("reward", "kl", "loss", "actor/grad_norm")
    assert [[m[k] for k in keys] for m in read_metrics(full)] == [
        [m[k] for k in keys] for m in read_metrics(part)
    ]


def test_export_writes_a_merged_model_with_the_trained_log_probs(lora_run, tmp_path, capsys):
    from transformers import AutoModelForCausalLM

    trainer, out = lora_run
    target = tmp_path / "merged"
    assert main(["export", str(out), "--output", str(target)]) == 0
    assert str(target) in capsys.readouterr().out
    exported = AutoModelForCausalLM.from_pretrained(target)
    assert not any(".lora_" in k or "base_layer" in k for k in exported.state_dict())
    batch = _random_batch(torch.Generator().manual_seed(1))
    torch.testing.assert_close(
        _logprobs(exported, batch), _logprobs(trainer.models.model, batch), atol=1e-5, rtol=0
    )
    assert sorted(p.name for p in target.iterdir() if p.name.startswith(".")) == []
    assert main(["export", str(out), "--output", str(target)]) == 2  # never over an existing export
    assert "already exists" in capsys.readouterr().err


def test_export_of_a_full_weight_run_is_its_checkpoint_model(digit_model_dir, seven_task, tmp_path):
    out = tmp_path / "full"
    Trainer(tiny_run_config(digit_model_dir, seven_task, out, "trainer.steps=1")).train()
    assert main(["export", str(out)]) == 0
    exported = load_file(out / "export" / "model.safetensors")
    saved = load_file(out / "checkpoints" / "step-000001" / "model.safetensors")
    assert exported.keys() == saved.keys() and all(torch.equal(exported[k], saved[k]) for k in saved)
    assert not (out / "export" / "trainer_state.json").exists()
    assert main(["export", str(tmp_path / "nothing")]) == 2


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["model.lora_r=-1"], "model.lora_r"),
        (["model.lora_r=4", "trainer.fsdp=true"], "trainer.fsdp"),
        (["model.lora_r=4", "data.curriculum=x.jsonl"], "curriculum_reset_optimizer"),
        (["model.lora_r=4", "model.lora_target_modules=[]"], "lora_target_modules"),
        (["model.lora_r=4", "model.lora_dropout=1.5"], "lora_dropout"),
    ],
)
def test_lora_config_errors_name_the_key(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, overrides)


@pytest.mark.parametrize(
    ("targets", "message"), [("[lm_head]", "LM head"), ("[no_such_proj]", "lora_target_modules")]
)
def test_adapters_on_the_head_or_on_missing_modules_are_refused(digit_model_dir, targets, message):
    cfg = load_config(None, ["model.lora_r=4", f"model.lora_target_modules={targets}"])
    with pytest.raises(ConfigError, match=message):
        add_adapters(load_model(str(digit_model_dir)), cfg.model)


def test_lora_run_config_is_saved_and_read_back(lora_run):
    _, out = lora_run
    saved = json.loads(json.dumps(load_config(out / "config.yaml").to_dict()))
    assert saved["model"]["lora_r"] == 16 and saved["model"]["lora_target_modules"] == ["all-linear"]


def test_a_lora_checkpoint_given_as_a_model_says_to_export_it(lora_run, capsys):
    _, out = lora_run
    ckpt = out / "checkpoints" / "step-000020"
    assert main(["eval", "--model", str(ckpt), "--data", "arithmetic", "--limit", "2", "--n", "1"]) == 2
    assert "semrl export" in capsys.readouterr().err
