"""MkDocs hook: LaTeX formulas rendered to MathML when the site is built.

``pymdownx.arithmatex`` (generic mode) finds ``$...$`` and ``$$...$$`` outside code and wraps them
in ``<span class="arithmatex">\\(...\\)</span>`` / ``<div class="arithmatex">\\[...\\]</div>``; this
hook turns each into MathML with ``latex2mathml``. Browsers render MathML themselves, so a page
needs no script, no font download and no network to show its formulas.
"""

from __future__ import annotations

import html
import re
from typing import Any

from latex2mathml.converter import convert

_BLOCK = re.compile(r'<div class="arithmatex">\\\[(.*?)\\\]</div>', re.S)
_INLINE = re.compile(r'<span class="arithmatex">\\\((.*?)\\\)</span>', re.S)


def _mathml(latex: str, display: str) -> str:
    return convert(html.unescape(latex).strip(), display=display)


def on_page_content(content: str, **_: Any) -> str:
    content = _BLOCK.sub(lambda m: f'<div class="math">{_mathml(m.group(1), "block")}</div>', content)
    return _INLINE.sub(lambda m: _mathml(m.group(1), "inline"), content)
