"""The text / Markdown layout of one table block (a title, a header row, body rows), shared by
the retrieval and news tables so the two print alike."""

from __future__ import annotations


def block_lines(title: str, head: list[str], body: list[list[str]], markdown: bool) -> list[str]:
    """Markdown: a ``###`` title and a pipe table (first column "method"). Text: the title, then
    columns padded to their widest cell (the first left-aligned, numbers right-aligned)."""
    if markdown:
        out = [f"### {title}\n", "| " + " | ".join(["method", *head[1:]]) + " |"]
        out.append("|" + "---|" * len(head))
        return out + ["| " + " | ".join(r) + " |" for r in body]
    out = [title]
    widths = [max(len(r[i]) for r in [head, *body]) for i in range(len(head))]
    for r in [head, ["-" * w for w in widths], *body]:
        cells = [r[0].ljust(widths[0])] + [r[i].rjust(widths[i]) for i in range(1, len(r))]
        out.append("  ".join(cells).rstrip())
    return out
