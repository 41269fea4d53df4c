"""Loading a tokenizer (``semrl.models.loading.load_tokenizer``): the same files give the same
object again in one process, and a changed, moved or forgotten directory loads afresh."""

from __future__ import annotations

import json
import os
import random
import shutil

from semrl.models import loading
from semrl.models.loading import TOKENIZERS_KEPT, load_tokenizer


def _fresh(path) -> object:  # noqa: ANN001
    """What transformers loads from ``path``, as ``load_tokenizer`` would without its cache."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(path))
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def _same_tokenizer(a, b) -> bool:  # noqa: ANN001
    texts = ["Pick a number (7).", "  \\boxed{\\frac{1}{2}} <|im_end|>", "é 7 ∑ x^2"]
    return (
        a.get_vocab() == b.get_vocab()
        and [a(t)["input_ids"] for t in texts] == [b(t)["input_ids"] for t in texts]
        and (a.pad_token_id, a.eos_token_id, a.bos_token_id)
        == (b.pad_token_id, b.eos_token_id, b.bos_token_id)
        and a.chat_template == b.chat_template
    )


def test_a_tokenizer_is_loaded_once_per_directory_and_again_when_a_file_changes(tiny_model_dir, tmp_path):
    loading._TOKENIZERS.clear()
    first = load_tokenizer(str(tiny_model_dir))
    assert _same_tokenizer(first, _fresh(tiny_model_dir))
    assert load_tokenizer(str(tiny_model_dir)) is first
    assert load_tokenizer(f"{tiny_model_dir}/.") is first  # the same directory, written another way

    copy = tmp_path / "copy"
    shutil.copytree(tiny_model_dir, copy)
    assert load_tokenizer(str(copy)) is not first  # another directory, even with the same files

    # a file rewritten with other content: another pad token, then another chat template
    config_file = copy / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    config["pad_token"] = "<|endoftext|>"
    config_file.write_text(json.dumps(config))
    changed = load_tokenizer(str(copy))
    assert changed.pad_token == "<|endoftext|>" != first.pad_token
    assert _same_tokenizer(changed, _fresh(copy))
    template = copy / "chat_template.jinja"
    template.write_text("{{ messages[0]['content'] }}")
    os.utime(template, ns=(1, 1))  # an older time than before: any change of time counts
    assert load_tokenizer(str(copy)).chat_template == "{{ messages[0]['content'] }}"
    assert load_tokenizer(str(tiny_model_dir)) is first


def test_the_cache_keeps_the_last_directories_only(tiny_model_dir, tmp_path):
    loading._TOKENIZERS.clear()
    copies = []
    for i in range(TOKENIZERS_KEPT + 1):
        copies.append(tmp_path / f"copy{i}")
        shutil.copytree(tiny_model_dir, copies[-1], ignore=shutil.ignore_patterns("*.safetensors"))
    loaded = [load_tokenizer(str(c)) for c in copies]
    assert len(loading._TOKENIZERS) == TOKENIZERS_KEPT
    order = list(range(1, TOKENIZERS_KEPT + 1))
    random.Random(0).shuffle(order)
    assert all(load_tokenizer(str(copies[i])) is loaded[i] for i in order)
    assert load_tokenizer(str(copies[0])) is not loaded[0]  # the oldest was let go
