"""Files that the architecture, runbook, config and security docs point at exist in the repository.

Those docs send readers to code by path ("checks/sharding.py", "deploy/k8s/configmap.yaml"); a move or
rename would leave them pointing nowhere.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ("architecture.md", "runbook.md", "config.md", "security.md")
#: A repository path: at least one directory, a known extension, not part of a longer or absolute path
#: (``/etc/kpmon/kpmon.yaml``, ``<state_dir>/run/kpmon.yaml`` are not repository files).
PATH = re.compile(r"(?<![\w/.<>-])((?:[a-z_][\w-]*/)+[\w.-]+\.(?:py|md|yaml|json|service|env|toml))\b")


def referenced_paths(text: str) -> set[str]:
    return set(PATH.findall(text))


def test_the_pattern_finds_repository_paths_only() -> None:
    found = referenced_paths(
        "see `checks/sharding.py` and docs/tap.md, not /etc/kpmon/kpmon.yaml or <state_dir>/run/kpmon.yaml"
    )
    assert found == {"checks/sharding.py", "docs/tap.md"}


@pytest.mark.parametrize("doc", DOCS)
def test_referenced_files_exist(doc: str) -> None:
    paths = referenced_paths((ROOT / "docs" / doc).read_text())
    assert paths, f"docs/{doc} names no file: the pattern is broken"
    missing = sorted(p for p in paths if not (ROOT / p).exists() and not (ROOT / "docs" / p).exists())
    assert not missing, f"docs/{doc} points at files that do not exist: {missing}"


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(text: str) -> set[str]:
    return {slug(h) for h in re.findall(r"^#{1,6} (.+)$", text, flags=re.MULTILINE)}


def test_slug_matches_github() -> None:
    assert slug("`apiversions.out_of_range`") == "apiversionsout_of_range"
    assert slug("Differences from ARCHITECTURE.md") == "differences-from-architecturemd"


@pytest.mark.parametrize("doc", DOCS)
def test_links_to_sections_resolve(doc: str) -> None:
    text = (ROOT / "docs" / doc).read_text()
    broken = []
    for target, anchor in re.findall(r"\]\(([\w.-]*\.md)?#([\w-]+)\)", text):
        linked = (ROOT / "docs" / target).read_text() if target else text
        if anchor not in anchors(linked):
            broken.append(f"{target or doc}#{anchor}")
    assert not broken, f"docs/{doc} links to sections that do not exist: {broken}"
