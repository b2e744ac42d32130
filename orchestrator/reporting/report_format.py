"""The report's text primitives: a table cell, a table block, a document of blocks as Markdown
or HTML, and plain JSON for report.json."""

from __future__ import annotations

import html
import math
import re
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

G, S, TOK = "{:.4g}", "{}", "tok"  # cell formats: number, text, token count


def fmt_tokens(n: float) -> str:
    """The one format of a token count, in tables, figures and the live table: 4096 -> '4,096',
    16777216 -> '16.8M' (batch sizes and budgets are token counts)."""
    n = float(n)
    if n >= 1e6:
        return f"{n / 1e6:.3g}M"
    return f"{int(round(n)):,}" if n >= 10 else f"{n:.3g}"


def cell(x: Any, fmt: str = "{:.4g}") -> str:
    """A table cell: '-' when missing, 'inf' when infinite; fmt "tok" for token counts."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    if isinstance(x, float) and math.isinf(x):
        return "inf"
    return fmt_tokens(round(x)) if fmt == "tok" else fmt.format(x)


def lr_text(lr: Optional[float], edge: Optional[str] = None) -> str:
    """A best (interpolated) lr as every table, sentence and figure writes it: 3 significant digits,
    with <= or >= when it is the lowest or highest tried (a bound); '-' when there is none."""
    if lr is None:
        return "-"
    return {"lowest": "<= ", "highest": ">= "}.get(edge or "", "") + f"{lr:.3g}"


def aligned(header: Sequence[str], rows: Sequence[Sequence[str]]) -> List[str]:
    """A table as printed lines: each column right-aligned to its widest cell, indented by two."""
    widths = [max(len(c) for c in col) for col in zip(header, *rows)]
    return ["  " + "  ".join(c.rjust(w) for c, w in zip(line, widths)) for line in [header, *rows]]


def table(rows: Sequence[Dict[str, Any]], columns: Sequence[Tuple[str, str, str]]) -> tuple:
    return ("table", [c[0] for c in columns], [[cell(row.get(key), fmt) for _, key, fmt in columns] for row in rows])


_TAG_START = re.compile(r"<(?=[A-Za-z/!?])")
"""A '<' that would open an HTML tag or comment: Markdown passes raw HTML through."""


_LINK_START = re.compile(r"\](?=[(\[])")
"""A ']' that closes a link's or an image's text (`[x](javascript:...)`, `![x](https://...)` fetched
when the file is shown, `[x][ref]`): escaped, it reads as a bracket; brackets of the report's own
text (`[575 - 885]`) are left as they are."""


def _inert(text: Any) -> str:
    """Text in Markdown that opens no HTML tag (a trial's name may hold `<script>`), no link or
    image, and no new line (one could start a heading or a link definition)."""
    text = _TAG_START.sub("&lt;", str(text))
    return _LINK_START.sub("\\]", text).replace("\r", " ").replace("\n", " ")


def to_markdown(doc: Sequence[tuple]) -> str:
    lines = []
    for kind, *rest in doc:
        if kind == "table":
            lines += [
                "| " + " | ".join(_inert(c).replace("|", "/") for c in rest[0]) + " |",
                "|" + " --- |" * len(rest[0]),
            ]
            lines += ["| " + " | ".join(_inert(c).replace("|", "/") for c in row) + " |" for row in rest[1]]
        elif kind == "img":
            lines.append(f"![{rest[0]}]({rest[0]})")
        elif kind in ("pre", "code"):  # pre: YAML; code: a shell command
            lines.append(f"```{'yaml' if kind == 'pre' else 'bash'}\n{rest[0].rstrip()}\n```")
        else:
            lines.append(_inert(rest[0]) if kind == "p" else "#" * int(kind[1]) + " " + _inert(rest[0]))
        lines.append("")
    return "\n".join(lines)


def to_html(doc: Sequence[tuple], title: str) -> str:
    e = html.escape

    def cells(row: Sequence[Any], tag: str) -> str:
        return "<tr>" + "".join(f"<{tag}>{e(str(c))}</{tag}>" for c in row) + "</tr>"

    parts = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>{e(title)}</title><style>body{{font-family:"
        "sans-serif;max-width:1100px;margin:2em auto}table{border-collapse:collapse}td,th{border:1px solid #ccc;"
        "padding:3px 8px;text-align:right}img{max-width:100%}</style></head><body>"
    ]
    for kind, *rest in doc:
        if kind == "table":
            parts.append("<table>" + cells(rest[0], "th") + "".join(cells(r, "td") for r in rest[1]) + "</table>")
        elif kind == "img":
            parts.append(f"<p><img src='{e(rest[0])}' alt='{e(rest[0])}'></p>")
        else:
            parts.append(
                f"<pre><code>{e(rest[0])}</code></pre>" if kind == "code" else f"<{kind}>{e(rest[0])}</{kind}>"
            )
    return "\n".join(parts + ["</body></html>"])


def json_safe(x: Any) -> Any:
    """Plain JSON: numpy scalars to Python, non-finite floats to null."""
    if isinstance(x, dict):
        return {k: json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [json_safe(v) for v in x]
    x = x.item() if isinstance(x, np.generic) else x
    return None if isinstance(x, float) and not math.isfinite(x) else x
