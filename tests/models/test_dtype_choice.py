"""``model.dtype: auto`` (``semrl.models.dtype_choice``): chosen by the probe's measurement, cached
per machine and model, recorded in the run's config.yaml, and kept by a resumed run whatever the
machine it resumes on measures."""

from __future__ import annotations

import json
import logging
from collections import Counter

import pytest
import torch
import yaml

from semrl.models.dtype_choice import (
    BF16_MIN_SPEEDUP,
    PROBE_FILE,
    ProbeResult,
    cached_probe,
    choose_dtype,
    linear_shapes,
    probe_matmuls,
)
from tests.helpers import tiny_run_config


class Probe:
    """A measurement given in advance: bf16 ``speedup`` times as fast as fp32; counts its calls."""

    def __init__(self, speedup: float) -> None:
        self.speedup, self.calls = speedup, 0

    def __call__(self, shapes: list[tuple[int, int]]) -> ProbeResult:
        self.calls += 1
        return ProbeResult(1.0, 1.0 / self.speedup)


def _config(digit_model_dir):
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(digit_model_dir)


@pytest.mark.parametrize(
    ("speedup", "expected"),
    [(7.0, "bfloat16"), (BF16_MIN_SPEEDUP, "bfloat16"), (1.4, "float32"), (0.2, "float32")],
)
def test_vllm_on_a_cpu_takes_what_the_probe_measured(digit_model_dir, tmp_path, speedup, expected):
    probe = Probe(speedup)
    choice = choose_dtype("vllm", "cpu", _config(digit_model_dir), tmp_path, probe)
    assert (choice.dtype, probe.calls) == (expected, 1)
    assert f"{speedup:.2f}x" in choice.reason and "measured" in choice.reason


def test_hf_on_a_cpu_stays_float32_without_probing(digit_model_dir, tmp_path):
    probe = Probe(7.0)
    choice = choose_dtype("hf", "cpu", _config(digit_model_dir), tmp_path, probe)
    assert (choice.dtype, probe.calls) == ("float32", 0)
    assert "hf engine" in choice.reason


def test_the_probe_is_cached_per_machine_and_model_shape(digit_model_dir, tmp_path):
    shapes = linear_shapes(_config(digit_model_dir))
    probe = Probe(3.0)
    first, cached = cached_probe(shapes, tmp_path, probe)
    again, cached_again = cached_probe(shapes, tmp_path, probe)
    assert (cached, cached_again, probe.calls) == (False, True, 1) and first == again
    other = [(n_in * 2, n_out) for n_in, n_out in shapes]  # another model: measured again
    cached_probe(other, tmp_path, probe)
    assert probe.calls == 2 and len(json.loads((tmp_path / PROBE_FILE).read_text())) == 2
    (tmp_path / PROBE_FILE).write_text("{not json")  # a damaged cache is measured over
    assert cached_probe(shapes, tmp_path, probe)[1] is False and probe.calls == 3
    assert cached_probe(shapes, tmp_path, probe)[1] is True


def test_the_probed_shapes_are_the_models_linear_layers(tmp_path):
    """Against an independent reference: the (in, out) of every nn.Linear of decoder layer 0 and the
    LM head of real models built from configs with grouped-query attention and without it."""
    from transformers import LlamaConfig, LlamaForCausalLM

    for heads, kv_heads, hidden, inter in [(4, 2, 64, 96), (8, 8, 128, 320), (6, 2, 96, 256)]:
        config = LlamaConfig(
            hidden_size=hidden,
            intermediate_size=inter,
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            num_hidden_layers=1,
            vocab_size=211,
        )
        model = LlamaForCausalLM(config)
        layers = [*model.model.layers[0].modules(), model.lm_head]
        reference = Counter((m.in_features, m.out_features) for m in layers if isinstance(m, torch.nn.Linear))
        assert Counter(linear_shapes(config)) == reference


def test_a_real_probe_measures_both_dtypes():
    result = probe_matmuls([(64, 96), (96, 64)], tokens=16, repeats=1)
    assert result.float32_s > 0 and result.bfloat16_s > 0 and result.bf16_speedup > 0


def _resolve(cfg, resume, probe):
    from semrl.core.distributed import ProcessGroup
    from semrl.runtime import setup

    return setup.resolve_dtype(cfg, resume, ProcessGroup(), probe)


def test_a_run_records_the_dtype_auto_resolved_and_a_resume_keeps_it(
    digit_model_dir, seven_task, tmp_path, monkeypatch, caplog
):
    """The public path a run takes: ``resolve_dtype`` then ``prepare_run_dir`` (the Trainer's first
    steps). A machine whose bf16 is faster records bfloat16; the run resumed on one whose bf16 is
    slower keeps it, and probes nothing."""
    from semrl.core.distributed import ProcessGroup
    from semrl.runtime import setup

    monkeypatch.setenv("SEMRL_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "run"
    cfg = tiny_run_config(digit_model_dir, seven_task, out, "model.dtype=auto", "rollout.engine=vllm")
    assert cfg.model.dtype == "auto"
    with caplog.at_level(logging.INFO, logger="semrl.runtime.setup"):
        resolved = _resolve(cfg, False, Probe(4.0))
    assert resolved.model.dtype == "bfloat16"
    assert "model.dtype=auto: bfloat16" in caplog.text
    setup.prepare_run_dir(resolved, False, ProcessGroup())
    recorded = yaml.safe_load((out / "config.yaml").read_text())
    assert recorded["model"]["dtype"] == "bfloat16"

    # another machine: its own cache, and bf16 slower there
    monkeypatch.setenv("SEMRL_CACHE", str(tmp_path / "other-cache"))
    slower = Probe(0.2)
    assert _resolve(cfg, True, slower).model.dtype == "bfloat16"
    assert slower.calls == 0
    # a new run on that machine takes float32
    other = tiny_run_config(
        digit_model_dir, seven_task, tmp_path / "new", "model.dtype=auto", "rollout.engine=vllm"
    )
    assert _resolve(other, False, slower).model.dtype == "float32" and slower.calls == 1


def test_an_explicit_dtype_is_never_probed(digit_model_dir, seven_task, tmp_path):
    probe = Probe(7.0)
    cfg = tiny_run_config(digit_model_dir, seven_task, tmp_path / "run", "rollout.engine=vllm")
    assert _resolve(cfg, False, probe).model.dtype == "float32" and probe.calls == 0
