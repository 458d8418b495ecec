"""The documents hold together: every relative link of the README, CONTRIBUTING.md,
CHANGELOG.md and docs/*.md names a file of the repository (and, with a ``#anchor``, a
heading of it), every page of docs/ is reachable from the README, the documents cite
nothing outside the repository, and the README stays a manual one reads top to bottom."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

import pytest

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
DOCS = REPO / "docs"
DOCUMENTS = [README, REPO / "CONTRIBUTING.md", REPO / "CHANGELOG.md", *sorted(DOCS.glob("*.md"))]
README_MAX_LINES = 650

FENCED_BLOCK = re.compile(r"^ {0,3}(`{3,}|~{3,}).*?^ {0,3}\1[ \t]*$", re.M | re.S)
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1", re.S)
LINK = re.compile(r"\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^()\s<>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^ {0,3}#{1,6}[ \t]+(.+?)(?:[ \t]+#+)?[ \t]*$", re.M)
EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.I)  # http:, https:, mailto: ...
# Citations of documents that are not in the repository.
OUTSIDE = re.compile(
    r"\bSPEC\b|SPEC\.md|DESIGN\.md|(?<![\w/.-])reference/|\b[Ii]ssues? #?\d+|(?<![\w&#])#\d+\b"
)


def prose(text: str) -> str:
    """The text without its fenced code blocks and code spans (where nothing is a link)."""
    return CODE_SPAN.sub("", FENCED_BLOCK.sub("", text))


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces as ``-``."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text
    text = re.sub(r"<[^>]+>", "", text).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    found: set[str] = set()
    for heading in HEADING.findall(FENCED_BLOCK.sub("", path.read_text(encoding="utf-8"))):
        base = slug(heading)
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(path: Path) -> list[str]:
    return LINK.findall(prose(path.read_text(encoding="utf-8")))


def name(path: Path) -> str:
    return str(path.relative_to(REPO))


def test_the_documents_exist() -> None:
    for path in DOCUMENTS:
        assert path.is_file(), name(path)
    assert (REPO / "LICENSE").is_file()


@pytest.mark.parametrize("path", DOCUMENTS, ids=name)
def test_every_relative_link_names_a_file_and_a_heading(path: Path) -> None:
    broken: list[str] = []
    for target in links(path):
        if EXTERNAL.match(target):
            continue
        file_part, _, anchor = target.partition("#")
        linked = (path.parent / unquote(file_part)).resolve() if file_part else path
        if not linked.exists() or REPO not in (linked, *linked.parents):
            broken.append(f"{target}: no such file")
        elif anchor and linked.suffix == ".md" and unquote(anchor) not in anchors(linked):
            broken.append(f"{target}: {name(linked)} has no heading #{anchor}")
    assert broken == [], f"{name(path)}: {broken}"


def test_every_docs_page_is_linked_from_the_readme() -> None:
    linked = {(REPO / target.partition("#")[0]).resolve() for target in links(README)}
    orphans = [name(page) for page in sorted(DOCS.glob("*.md")) if page.resolve() not in linked]
    assert orphans == []


@pytest.mark.parametrize("path", DOCUMENTS, ids=name)
def test_the_documents_cite_nothing_outside_the_repository(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    found = [f"line {text.count(chr(10), 0, m.start()) + 1}: {m.group()}" for m in OUTSIDE.finditer(text)]
    assert found == [], f"{name(path)}: {found}"


def test_the_readme_is_a_manual_of_at_most_650_lines() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines: move reference to docs/"


def test_slugs_are_githubs() -> None:
    assert slug("WebSocket `/v1/ws`") == "websocket-v1ws"
    assert slug("One file: `dist/kapok.pyz`") == "one-file-distkapokpyz"
    assert slug("What Kapok does differently, on purpose") == "what-kapok-does-differently-on-purpose"
    assert slug("Results of 2026-11-24") == "results-of-2026-11-24"
