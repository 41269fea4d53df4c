"""The pages generated from the code, written again (tests/test_docs.py fails while one is stale):

    python scripts/generate_docs.py

- docs/config-reference.md: the tables of ``semrl config``, one per section;
- docs/methods/{rose,sent,treepo,latr}.md: each method's option table, in place;
- docs/index.md: the README without its repository-only block, links made the site's own.
"""

from __future__ import annotations

import re
from pathlib import Path

from semrl.config.load import config_reference, method_sections
from semrl.config.options import section_reference

ROOT = Path(__file__).resolve().parents[1]
INTRO = """# Config reference

Every key of a config file, generated from the registry by `semrl config` (the same tables; to a \
terminal it wraps them to its width). Keys are given as `section.key`, in YAML as nested sections or \
on the command line as `section.key=value`. One table per section; a method's section is read only \
when `algorithm.method` names it.

"""


def site_home(readme: str) -> str:
    """docs/index.md from the README."""
    without = re.sub(r"<!-- readme-only -->.*?<!-- /readme-only -->\n\n?", "", readme, flags=re.S)
    return without.replace("](docs/", "](")


def main() -> None:
    (ROOT / "docs" / "config-reference.md").write_text(INTRO + config_reference() + "\n")
    for name, section in method_sections().items():  # every method with a page of its own
        page = ROOT / "docs" / "methods" / f"{name}.md"
        if not page.exists():
            continue
        lines = page.read_text().splitlines()
        rows = [i for i, line in enumerate(lines) if line.startswith(f"| `{name}.")]
        lines[rows[0] : rows[-1] + 1] = section_reference(name, section)
        page.write_text("\n".join(lines) + "\n")
    (ROOT / "docs" / "index.md").write_text(site_home((ROOT / "README.md").read_text()))


if __name__ == "__main__":
    main()
