"""README.md stays a user's page: short enough to read (details live in docs/ and benches/README.md), and
every relative link in it, and in the pages it sends readers to, names a file (and heading) that exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MAX_README_LINES = 250
PAGES = [README, ROOT / "CONTRIBUTING.md", ROOT / "benches" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

_FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
_CODE = re.compile(r"`[^`\n]*`")
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def links(text: str) -> list[str]:
    """Targets of the markdown links ``[text](target)`` outside code blocks and inline code."""
    return _LINK.findall(_CODE.sub("", _FENCE.sub("", text)))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped (``-`` and ``_`` kept), spaces to ``-``."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Anchors of a markdown page's headings (a repeated heading gets ``-1``, ``-2``… as on GitHub)."""
    seen: dict[str, int] = {}
    out: set[str] = set()
    for m in re.finditer(r"^#{1,6} +(.+?) *#*$", _FENCE.sub("", page.read_text()), re.M):
        s = slug(m.group(1))
        n = seen.get(s, 0)
        out.add(s if n == 0 else f"{s}-{n}")
        seen[s] = n + 1
    return out


def broken_links(page: Path, root: Path = ROOT) -> list[str]:
    """Each relative link of ``page`` whose file, or whose heading in a markdown file, does not exist
    (paths in the messages are relative to ``root``)."""
    bad = []
    for target in links(page.read_text()):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto: — not a file of the repository
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            bad.append(f"{target} (no file {file.relative_to(root) if file.is_relative_to(root) else file})")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            bad.append(f"{target} (no heading #{anchor} in {file.relative_to(root)})")
    return bad


def test_readme_is_at_most_250_lines() -> None:
    n = len(README.read_text().splitlines())
    assert n <= MAX_README_LINES, (
        f"README.md has {n} lines (limit {MAX_README_LINES}): move details to docs/ or benches/README.md "
        "and link to them"
    )


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page: Path) -> None:
    assert broken_links(page) == []


def test_the_link_check_finds_a_missing_file_and_heading(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# Other page\n\n## A heading: `with code` (and more)\n")
    page = tmp_path / "page.md"
    page.write_text(
        "[ok](other.md) [ok](other.md#a-heading-with-code-and-more) [web](https://example.org/x.md)\n"
        "[gone](missing.md) [bad](other.md#no-such-heading)\n"
        "```\n[in code](also-missing.md)\n```\n`[inline](nor-this.md)`\n"
    )
    bad = broken_links(page, root=tmp_path)
    assert [b.split(" ")[0] for b in bad] == ["missing.md", "other.md#no-such-heading"]
