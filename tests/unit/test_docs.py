"""The README and docs/ hold together: every relative link reaches a file of the tree (and a heading,
where it names one), and every page is on the README's map."""

import re
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[2]
PAGES = [PROJECT / "README.md", *sorted((PROJECT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def anchors(page: Path) -> set[str]:
    """GitHub's anchors for the page's headings."""
    headings = re.findall(r"^#+ (.+)$", re.sub(r"```.*?```", "", page.read_text(), flags=re.S), re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-") for heading in headings}


def test_every_relative_link_reaches_a_file_and_heading_of_the_tree():
    broken = []
    for page in PAGES:
        for target in LINK.findall(page.read_text()):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            if not file.exists() or (anchor and file.suffix == ".md" and anchor not in anchors(file)):
                broken.append(f"{page.relative_to(PROJECT)}: {target}")
    assert broken == []


def test_every_docs_page_is_on_the_readmes_map_and_the_readme_stays_short():
    readme = (PROJECT / "README.md").read_text()
    assert {f"docs/{page.name}" for page in PAGES[1:]} <= set(LINK.findall(readme))
    assert len(readme.splitlines()) <= 200
