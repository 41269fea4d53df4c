"""Own data: files and directories through the datasets library, column mapping, extra columns for
reward functions, hub ids offline, and plain-text prompt templates for base models."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from semrl.config.load import load_config
from semrl.config.sections import ConfigError
from semrl.data import Columns, DataError, build_prompt_ids, load_problems, problem_columns

ROWS = [
    {"question": f"What is {i} + {i}?", "final": str(2 * i), "difficulty": i % 3, "source": "toy"}
    for i in range(7)
]
MAPPED = Columns(problem="question", answer="final")


def _check(problems):
    assert [p.problem for p in problems] == [r["question"] for r in ROWS]
    assert [p.answer for p in problems] == [r["final"] for r in ROWS]
    assert len({p.id for p in problems}) == len(ROWS)
    columns = problem_columns(problems[4])
    assert columns["difficulty"] == 1 and columns["source"] == "toy" and columns["answer"] == "8"


def test_parquet_with_column_mapping(tmp_path):
    path = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist([{**r, "id": f"q{i}"} for i, r in enumerate(ROWS)]), path)
    problems, skipped = load_problems(path, columns=MAPPED)
    _check(problems)
    assert skipped == 0 and problems[2].id == "q2"


@pytest.mark.parametrize("layout", ["json_array", "json_lines"])
def test_json_through_datasets_numbers_rows_without_ids(tmp_path, layout):
    path = tmp_path / "train.json"
    text = json.dumps(ROWS) if layout == "json_array" else "".join(json.dumps(r) + "\n" for r in ROWS)
    path.write_text(text)
    problems, _ = load_problems(path, columns=MAPPED)
    _check(problems)
    assert problems[0].id == "row-1"


def test_saved_dataset_directory_with_splits(tmp_path):
    import datasets

    data = datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_list(ROWS),
            "test": datasets.Dataset.from_list([{**ROWS[0], "question": "held out?"}]),
        }
    )
    data.save_to_disk(str(tmp_path / "saved"))
    _check(load_problems(tmp_path / "saved", columns=MAPPED, split="train")[0])
    assert load_problems(tmp_path / "saved", columns=MAPPED, split="test")[0][0].problem == "held out?"
    with pytest.raises(DataError, match=r"has splits \['test', 'train'\], not 'validation'"):
        load_problems(tmp_path / "saved", columns=MAPPED, split="validation")


def test_missing_mapped_column_names_the_option(tmp_path):
    path = tmp_path / "train.json"
    path.write_text(json.dumps(ROWS))
    with pytest.raises(DataError, match="data.problem_key"):
        load_problems(path)  # the default 'problem' column is absent


def test_hub_id_offline_gives_a_clear_error(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    import datasets

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True, raising=False)
    with pytest.raises(DataError, match="save_to_disk"):
        load_problems("someone/some-math-dataset")


def test_prompt_template(tiny_model_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    template = "Question: {problem}\nAnswer: Let's think step by step."
    ids = build_prompt_ids(tokenizer, "1 + 1?", "ignored system prompt", template)
    assert ids == tokenizer("Question: 1 + 1?\nAnswer: Let's think step by step.")["input_ids"]
    assert ids != build_prompt_ids(tokenizer, "1 + 1?", "ignored system prompt")
    for bad, message in [
        ("no field", "no {problem} field"),
        ("{question}", "only field is {problem}"),
        ("{problem} {", "only field"),
    ]:
        with pytest.raises(ConfigError, match=message):
            load_config(None, [f"data.prompt_template={json.dumps(bad)}"])


def test_training_on_mapped_parquet_with_a_template(tiny_model_dir, tmp_path):
    from semrl.runtime.trainer import Trainer

    path = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist(ROWS), path)
    cfg = load_config(
        None,
        [
            f"model.name={tiny_model_dir}",
            f"data.train={path}",
            "data.eval=null",
            "data.problem_key=question",
            "data.answer_key=final",
            'data.prompt_template="Q: {problem}\\nA:"',
            "rollout.group_size=2",
            "rollout.prompts_per_step=2",
            "rollout.max_new_tokens=4",
            "trainer.steps=1",
            "logging.progress=false",
            "logging.report_to=[]",
            f"logging.output_dir={tmp_path / 'run'}",
            "reward.num_workers=1",
        ],
    )
    trainer = Trainer(cfg)
    assert (
        trainer.curriculum.problems[3].problem == "What is 3 + 3?"
        and trainer.curriculum.problems[3].id == "row-4"
    )
    assert "reward" in trainer.train()
