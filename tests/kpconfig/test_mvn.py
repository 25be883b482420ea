"""copy_dependencies: a failed Maven run is a FetchError carrying Maven's output, its staging removed."""

from __future__ import annotations

from pathlib import Path

import pytest

from kpconfig.mvn import FetchError, copy_dependencies


def test_a_failed_copy_says_what_and_why_and_discards_its_staging(tmp_path: Path) -> None:
    pom = tmp_path / "pom.xml"
    pom.write_text("<project>not a POM")  # Maven fails on it before it would go to the network
    staging = tmp_path / "staging"
    (staging / "libs").mkdir(parents=True)
    with pytest.raises(FetchError, match=r"(?s)^mvn could not resolve the test's jars:\n.*pom\.xml"):
        copy_dependencies(
            pom, ["-Dx=1"], staging / "libs", "mvn could not resolve the test's jars", discard=staging
        )
    assert not staging.exists()
