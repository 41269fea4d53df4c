"""Run reports: trees.jsonl from a real ROSE run, the self-contained HTML page, the tree viewer in
headless Chromium, and run comparison."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from semrl.cli import main
from semrl.config.load import load_config
from semrl.runtime.trainer import Trainer
from semrl.studies.runs import compare_runs, read_jsonl, write_report

HOSTILE = "Pick </script><script>window.pwned = 1</script> & <b>bold</b> \u2028 a number"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def rose_run(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """3 ROSE steps of the tiny random model (16-token responses, so trees have depth), with a
    problem whose text tries to break out of the page's data script."""
    root = tmp_path_factory.mktemp("report")
    task = root / "task.jsonl"
    rows = [{"id": f"h{i}", "problem": f"{HOSTILE} ({i})", "answer": "7"} for i in range(16)]
    task.write_text("".join(json.dumps(r) + "\n" for r in rows))
    run = root / "rose"
    cfg = load_config(
        None,
        [
            f"model.name={tiny_model_dir}",
            f"data.train={task}",
            "data.eval=null",
            "rollout.group_size=6",
            "rollout.prompts_per_step=2",
            "rollout.max_new_tokens=16",
            "trainer.micro_batch_size=12",
            "trainer.steps=3",
            "algorithm.method=rose",
            "rose.epsilon=0.3",
            "rose.alpha=0",
            "logging.trees_per_step=2",
            f"logging.output_dir={run}",
            "logging.progress=false",
            "logging.report_to=[]",
            "logging.save_every=0",
        ],
    )
    Trainer(cfg).train()
    return run


def test_trees_jsonl_describes_each_group(rose_run):
    trees = read_jsonl(rose_run / "trees.jsonl")
    assert [t["step"] for t in trees] == [1, 1, 2, 2, 3, 3]
    branched = 0
    for tree in trees:
        chains = tree["chains"]
        assert len(chains) == 6 and tree["problem"].startswith("Pick </script>")
        rewards = [c["reward"] for c in chains]
        for c in chains:
            segs = c["segments"]
            # segments tile the response
            assert [s["start"] for s in segs] == [0, *(s["end"] for s in segs[:-1])] or c["length"] == 0
            assert not segs or segs[-1]["end"] == c["length"]
            if c["parent"] >= 0:
                branched += 1
                parent = chains[c["parent"]]
                assert c["branch"] is not None and set(c["branch"]) == {"entropy", "divergence", "score"}
                # the shared prefix has a node boundary at the branch point in both chains
                assert c["branch_position"] in {s["start"] for s in parent["segments"]} | {
                    parent["length"],
                    0,
                }
            else:
                assert c["branch"] is None
            # alpha = 0: segment advantages telescope to r - mean(r)
            total = sum(s["advantage"] for s in segs)
            assert total == pytest.approx(c["reward"] - sum(rewards) / len(rewards), abs=1e-5) or not segs
    assert branched > 0


def test_report_is_self_contained(rose_run):
    index = write_report(rose_run)
    page = index.read_text()
    assert "<script src" not in page and "<link" not in page and "@import" not in page
    assert "Content-Security-Policy" in page and "default-src 'none'" in page
    assert "window.pwned = 1</script>" not in page  # the data cannot close its script element
    for figure in ("reward.png", "entropy.png", "rose_branched_chains.png"):
        assert (index.parent / "figures" / figure).stat().st_size > 1000


def test_report_cli_and_missing_run(rose_run, tmp_path, capsys):
    assert main(["report", str(rose_run), "--output", str(tmp_path / "r")]) == 0
    assert (tmp_path / "r" / "index.html").exists()
    assert main(["report", str(tmp_path / "nothing")]) == 2
    assert "is '" in capsys.readouterr().err


def test_compare_runs_side_by_side(rose_run, tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    (other / "metrics.jsonl").write_text(
        "".join(json.dumps({"step": s, "entropy": 1.0 / s, "reward": 0.5}) + "\n" for s in (1, 2))
        + '{"step": 3, "ent'
    )  # a torn last line, as a killed run leaves it
    text = compare_runs([rose_run, other], ["entropy", "reward"], tmp_path / "plots")
    assert f"| metric | {rose_run.name} | other |" in text
    assert "| 2 |" in text and "0.5 |" in text
    assert (tmp_path / "plots" / "entropy.png").exists()


@pytest.mark.skipif(
    CHROMIUM is None and not os.environ.get("SEMRL_REQUIRE_BROWSER"),
    reason="Chromium is not installed (Debian: apt-get install chromium)",
)
def test_tree_viewer_in_headless_chromium(rose_run, tmp_path):
    assert CHROMIUM is not None, "SEMRL_REQUIRE_BROWSER is set but no chromium is on PATH"
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="playwright is not installed (pip install -e .[dev])"
    )
    index = write_report(rose_run)
    tree = read_jsonl(rose_run / "trees.jsonl")[0]
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=CHROMIUM,
            args=[
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
                "--disable-background-networking",
            ],
        )
        page = browser.new_page(viewport={"width": 1300, "height": 1100})
        requests: list[str] = []
        page.on("request", lambda r: requests.append(r.url))
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(index.as_uri())
        page.wait_for_selector("body[data-ready='1']", timeout=10_000)
        assert errors == []
        assert page.locator("#tree-svg .leaf").count() == len(tree["chains"])
        assert page.locator("#tree-svg .branch-point").count() == sum(
            c["parent"] >= 0 for c in tree["chains"]
        )
        assert page.locator("#train-charts .chart").count() >= 4
        # the hostile problem text is shown as text and ran nothing
        assert page.evaluate("window.pwned") is None
        assert "</script><script>window.pwned" in page.inner_text("#tree-problem")
        leaf = tree["chains"][-1]
        page.locator(f"#tree-svg .leaf[data-chain='{leaf['chain']}']").click()
        shown = page.inner_text("#path-text")
        assert shown == "".join(s["text"] for s in leaf["segments"])
        assert f"Chain {leaf['chain']}" in page.inner_text("#detail")
        shot = tmp_path / "tree_viewer.png"
        page.locator("#trees").screenshot(path=str(shot))
        browser.close()
    assert shot.stat().st_size > 5000
    assert all(url.startswith("file://") for url in requests), requests
    if os.environ.get("SEMRL_SCREENSHOT_DIR"):
        shutil.copy(shot, Path(os.environ["SEMRL_SCREENSHOT_DIR"]) / shot.name)


def test_evaluation_during_training_reaches_the_report(digit_model_dir, seven_task, tmp_path):
    held_out = tmp_path / "held_out.jsonl"
    held_out.write_text(
        "".join(
            json.dumps(
                {"id": f"e{i}", "problem": f"Choose a digit [{i}].", "answer": "7", "level": 1 + i % 2}
            )
            + "\n"
            for i in range(6)
        )
    )
    run = tmp_path / "run"
    cfg = load_config(
        None,
        [
            f"model.name={digit_model_dir}",
            f"data.train={seven_task}",
            f"data.eval={held_out}",
            "data.system_prompt=Answer with one digit.",
            "rollout.group_size=4",
            "rollout.prompts_per_step=2",
            "rollout.max_new_tokens=4",
            "trainer.micro_batch_size=8",
            "trainer.steps=3",
            "logging.eval_every=2",
            "logging.eval_samples=4",
            f"logging.output_dir={run}",
            "logging.progress=false",
            "logging.report_to=[]",
        ],
    )
    Trainer(cfg).train()
    rows = read_jsonl(run / "metrics.jsonl")
    evaluated = [r["step"] for r in rows if "eval/mean@4" in r]
    assert evaluated == [0, 2, 3]
    for r in rows:
        if "eval/mean@4" in r:
            assert r["eval/problems"] == 6 and r["eval/pass@1"] == pytest.approx(r["eval/mean@4"])
            assert {"eval/maj@4", "eval/distinct_answers", "eval/response_length/correct"} <= set(r)
    page = write_report(run).read_text()
    assert (
        '"eval_table": {"columns": ["step", "mean@4", "pass@1", "pass@2", "pass@4", "maj@1", "maj@2", "maj@4"'
        in page
    )
