"""Every figure in docs/ drawn again from the runs committed in results/, with one command:

    python scripts/make_figures.py            # from the repository's root; needs the dev extra

1. ``semrl compare`` over Study 1's, Study 2's and Study 3's runs, as docs/results.md records the
   commands, into ``results/study_arith/compare/``, ``results/study_sparse/compare/`` and
   ``results/study3/compare-look-3/`` (tables, aggregate.json, figures, the decisions' forest plot;
   an unchanged semrl writes them byte for byte again);
2. the figures docs/ shows, copied from there into ``docs/figures/``;
3. the tree-viewer screenshot (``docs/figures/rose_demo_tree_viewer.png``) from Study 1's ROSE run at
   seed 0 (``semrl report``, then headless Chromium through playwright), at twice the pixel density of
   a 760-pixel-wide page, so that the site shows its labels at their own size.

Colours come from ``semrl.studies.runs.METHOD_COLORS``, one per method name, in every figure.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMPARES = {  # results/STUDY: (the options, the output directory under it)
    "study_arith": (["--baseline", "dr_grpo"], "compare"),
    "study_sparse": (
        ["--decide", "configs/study/study_sparse_rules.yaml", "--baseline", "dr_grpo"],
        "compare",
    ),
    # the last look (docs/results.md, "Study 3: look 3 at 12 seeds"); the looks log already holds it
    "study3": (["--decide", "configs/study/study3_rules.yaml", "--baseline", "dr_grpo"], "compare-look-3"),
}
SHOWN = {  # docs/figures/NAME: the compare figure it is
    "study_pass_at_k_eval.png": "study_arith/compare/figures/pass_at_k_eval.png",
    "study_pass_at_k_transfer.png": "study_arith/compare/figures/pass_at_k_transfer.png",
    "study_entropy.png": "study_arith/compare/figures/entropy.png",
    "study2_pass_at_k_eval.png": "study_sparse/compare/figures/pass_at_k_eval.png",
    "study2_decisions.png": "study_sparse/compare/figures/decisions.png",
    "study3_decisions.png": "study3/compare-look-3/figures/decisions.png",
}
VIEWER_RUN = "results/study_arith/rose/seed-0"
VIEWER_STEP = 7  # the first tree of this step, its first correct branched chain clicked


def compare_studies() -> None:
    for study, (options, output) in COMPARES.items():
        command = [
            sys.executable,
            "-m",
            "semrl",
            "compare",
            f"results/{study}",
            *options,
            "--output",
            f"results/{study}/{output}",
        ]
        print("$", " ".join(command[2:]), flush=True)
        subprocess.run(command, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    for name, source in SHOWN.items():
        shutil.copyfile(ROOT / "results" / source, ROOT / "docs" / "figures" / name)
        print(f"docs/figures/{name} <- results/{source}")


def screenshot_viewer() -> None:
    from playwright.sync_api import sync_playwright

    from semrl.core.jsonl import read_jsonl
    from semrl.studies.runs import write_report

    tree = next(t for t in read_jsonl(ROOT / VIEWER_RUN / "trees.jsonl") if t["step"] == VIEWER_STEP)
    chains = [c for c in tree["chains"] if c["correct"] and c["parent"] >= 0] or tree["chains"]

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise SystemExit("the viewer's screenshot needs Chromium (Debian: apt-get install chromium)")
    with tempfile.TemporaryDirectory() as tmp:
        index = write_report(ROOT / VIEWER_RUN, Path(tmp) / "report")
        with sync_playwright() as pw:
            flags = ["--headless", "--no-sandbox", "--disable-gpu"]
            browser = pw.chromium.launch(executable_path=chromium, args=flags)
            page = browser.new_page(viewport={"width": 760, "height": 900}, device_scale_factor=2)
            page.goto(index.as_uri())
            page.wait_for_selector("body[data-ready='1']", timeout=20_000)
            select = page.locator("#tree-controls select")
            labels = select.locator("option").all_inner_texts()  # "step 7 · arith-0-40 · 8 chains"
            step = f"step {VIEWER_STEP} "
            label = next(t for t in labels if t.startswith(step) and tree["problem_id"] in t)
            select.select_option(label=label)
            page.locator(f"#tree-svg .leaf[data-chain='{chains[0]['chain']}']").click()
            target = ROOT / "docs" / "figures" / "rose_demo_tree_viewer.png"
            page.locator("#trees").screenshot(path=str(target))
            browser.close()
    print(f"docs/figures/rose_demo_tree_viewer.png <- {VIEWER_RUN} ({label})")


if __name__ == "__main__":
    compare_studies()
    screenshot_viewer()
