"""Every doc (README.md and docs/*.md) stands alone: its links stay in the repository and lead to files
and sections that exist, and the repository paths it names ("checks/sharding.py",
"deploy/k8s/configmap.yaml") exist, so a move or rename cannot leave a doc pointing nowhere.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
#: A repository path: at least one directory, a known extension, not part of a longer or absolute path
#: (``/etc/kpmon/kpmon.yaml``, ``<state_dir>/run/kpmon.yaml`` are not repository files).
PATH = re.compile(r"(?<![\w/.<>-])((?:[a-z_][\w-]*/)+[\w.-]+\.(?:py|md|yaml|json|service|env|toml))\b")
#: A Markdown link or image: ``[text](target)``.
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
#: Paths under a state or home directory the docs name as examples, not repository files.
NOT_IN_REPO = ("build/native/", "stream/", "run/", "airflow/", "deploy/client-")


def doc_id(path: Path) -> str:
    return str(path.relative_to(ROOT))


def referenced_paths(text: str) -> set[str]:
    return set(PATH.findall(text))


def links(text: str) -> list[str]:
    """Link targets outside fenced code blocks (a URL in an example config is not a link)."""
    prose = re.sub(r"^```.*?^```", "", text, flags=re.MULTILINE | re.DOTALL)
    return LINK.findall(prose)


def test_the_pattern_finds_repository_paths_only() -> None:
    found = referenced_paths(
        "see `checks/sharding.py` and docs/tap.md, not /etc/kpmon/kpmon.yaml or <state_dir>/run/kpmon.yaml"
    )
    assert found == {"checks/sharding.py", "docs/tap.md"}


def test_links_skip_code_blocks() -> None:
    text = "[a](tap.md) ![b](images/x.png)\n```yaml\nurl: [c](https://x.example)\n```\n[d](#e)"
    assert links(text) == ["tap.md", "images/x.png", "#e"]


@pytest.mark.parametrize("doc", DOCS, ids=doc_id)
def test_referenced_files_exist(doc: Path) -> None:
    paths = referenced_paths(doc.read_text())
    missing = sorted(
        p
        for p in paths
        if not (ROOT / p).exists() and not (doc.parent / p).exists() and not p.startswith(NOT_IN_REPO)
    )
    assert not missing, f"{doc_id(doc)} points at files that do not exist: {missing}"


@pytest.mark.parametrize("doc", DOCS, ids=doc_id)
def test_links_stay_in_the_repository_and_lead_to_a_file(doc: Path) -> None:
    broken = []
    for target in links(doc.read_text()):
        path = target.partition("#")[0]
        outside = re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("/")
        if outside or (path and ROOT not in (doc.parent / path).resolve().parents):
            broken.append(f"{target}: leaves the repository")
        elif path and not (doc.parent / path).exists():
            broken.append(f"{target}: no such file")
    assert not broken, f"{doc_id(doc)}: {broken}"


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(text: str) -> set[str]:
    prose = re.sub(r"^```.*?^```", "", text, flags=re.MULTILINE | re.DOTALL)
    return {slug(h) for h in re.findall(r"^#{1,6} (.+)$", prose, flags=re.MULTILINE)}


def test_slug_matches_github() -> None:
    assert slug("`apiversions.out_of_range`") == "apiversionsout_of_range"
    assert slug("Differences from ARCHITECTURE.md") == "differences-from-architecturemd"
    assert slug("12. What clients see when a tap dies") == "12-what-clients-see-when-a-tap-dies"


@pytest.mark.parametrize("doc", DOCS, ids=doc_id)
def test_links_to_sections_resolve(doc: Path) -> None:
    text = doc.read_text()
    broken = []
    for target in links(text):
        path, _, anchor = target.partition("#")
        if not anchor or (path and not path.endswith(".md")):
            continue
        linked = (doc.parent / path).read_text() if path else text
        if anchor not in anchors(linked):
            broken.append(target)
    assert not broken, f"{doc_id(doc)} links to sections that do not exist: {broken}"


def test_the_checks_can_fail(tmp_path: Path) -> None:
    """An outside link, a missing file and a missing section are each caught."""
    text = "[a](../../shared/ARCHITECTURE.md) [b](https://example.com) [c](nope.md) [d](#nowhere)"
    found = links(text)
    assert found == ["../../shared/ARCHITECTURE.md", "https://example.com", "nope.md", "#nowhere"]
    doc = ROOT / "docs" / "x.md"
    assert ROOT not in (doc.parent / found[0]).resolve().parents
    assert not (doc.parent / found[2]).exists()
    assert "nowhere" not in anchors(text)
