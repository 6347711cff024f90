"""Every relative markdown link in README.md and docs/*.md points to an existing file (and, with a
#fragment, to a heading of it), and the README keeps the commands .ci/run copies from it."""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*$", re.M)


def doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    return {slug(h) for h in HEADING.findall(FENCE.sub("", path.read_text()))}


def broken_links(path: Path) -> list[str]:
    """'<target>: <why>' for each relative link of a markdown file that does not resolve."""
    out = []
    for target in LINK.findall(FENCE.sub("", path.read_text())):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        file_part, _, fragment = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        if not dest.exists():
            out.append(f"{target}: no file {dest}")
        elif fragment and dest.suffix == ".md" and fragment not in anchors(dest):
            out.append(f"{target}: no heading #{fragment} in {dest.name}")
    return out


@pytest.mark.parametrize("path", doc_files(), ids=lambda p: p.name)
def test_relative_links_resolve(path: Path) -> None:
    assert broken_links(path) == []


def test_checker_finds_broken_links(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# A title: here\n")
    doc = tmp_path / "doc.md"
    doc.write_text("[ok](other.md#a-title-here) [gone](missing.md) [bad](other.md#nope) "
                   "[web](https://example.com/x.md)\n```\n[in code](nowhere.md)\n```\n")
    assert broken_links(doc) == [f"missing.md: no file {tmp_path / 'missing.md'}",
                                 "other.md#nope: no heading #nope in other.md"]


def test_readme_links_architecture_and_moved_docs() -> None:
    targets = set(LINK.findall(FENCE.sub("", (ROOT / "README.md").read_text())))
    for doc in ("docs/architecture.md", "docs/guide.md", "docs/results.md"):
        assert any(t.split("#")[0] == doc for t in targets), doc


def readme_test_commands(readme: str) -> list[str]:
    """The Quickstart block's test command and the Ray test command, as the README writes them."""
    block = re.search(r"^## Quickstart\n.*?^```bash\n(.*?)^```", readme, re.S | re.M).group(1)
    quick = [ln.split("  #")[0].strip() for ln in block.splitlines() if "pytest" in ln]
    return quick + re.findall(r"`(pip install [^`]*pytest -m ray)`", readme)


def test_readme_keeps_the_commands_ci_runs() -> None:
    """.ci/run runs the README's test commands exactly as written: each is still in both."""
    commands = readme_test_commands((ROOT / "README.md").read_text())
    assert len(commands) == 2, commands
    ci = (ROOT / ".ci/run").read_text()
    for cmd in commands:
        assert cmd in ci, cmd


def test_readme_is_a_short_guide() -> None:
    assert len((ROOT / "README.md").read_text().splitlines()) <= 250
