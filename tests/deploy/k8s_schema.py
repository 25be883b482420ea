"""kubeconform over Kubernetes objects built in a test, with the schemas deploy/manifests.py prepares (the
Kubernetes ones from kubernetes-validate, the SparkApplication one from deploy/k8s/schemas/)."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from deploy import manifests


def kubeconform(objects: Sequence[dict[str, Any]], directory: Path) -> subprocess.CompletedProcess[str]:
    """kubeconform's verdict on ``objects``; skips the test without kubeconform or the schemas."""
    binary, source = manifests.find_kubeconform(), manifests.bundled_schemas()
    if binary is None or source is None:
        pytest.skip("kubeconform and kubernetes-validate are needed (python -m deploy.manifests --help)")
    schemas = manifests.prepare_schemas(source, directory / "k8s-schemas")
    path = directory / "objects.yaml"
    path.write_text(yaml.safe_dump_all(list(objects), sort_keys=False))
    return subprocess.run(
        manifests.kubeconform_argv(binary, schemas, [str(path)]), capture_output=True, text=True, check=False
    )


def assert_valid(objects: Sequence[dict[str, Any]], directory: Path) -> None:
    """Every object valid, none skipped (a SparkApplication is checked against kpmon's CRD schema)."""
    assert objects, "nothing to validate"
    done = kubeconform(objects, directory)
    assert done.returncode == 0, done.stdout + done.stderr
    summary = done.stdout.strip().splitlines()[-1]
    assert re.search(rf"Valid: {len(objects)}, Invalid: 0, Errors: 0, Skipped: 0", summary), summary
