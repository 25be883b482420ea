"""Schema-check the Kubernetes manifests (deploy/k8s, the spark pod template) with kubeconform.

kubeconform normally downloads its JSON schemas from GitHub. Here they come from the ``kubernetes-validate``
package on PyPI, which bundles them; its schemas point at ``/api/_definitions.json`` on kubernetes.io, so
they are copied with those references turned into local files. SparkApplication is checked against
deploy/k8s/schemas/ (kpmon's subset of the spark-operator CRD).

    GOBIN=$KPMON_HOME/bin go install github.com/yannh/kubeconform/cmd/kubeconform@v0.7.0
    pip install kubernetes-validate
    python -m deploy.manifests
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from kpconfig.paths import kpmon_home

DEPLOY = Path(__file__).resolve().parent
K8S_DIR = DEPLOY / "k8s"
POD_TEMPLATE = DEPLOY / "spark" / "k8s-pod-template.yaml"
CRD_SCHEMAS = K8S_DIR / "schemas"
KUBECONFORM_VERSION = "v0.7.0"
#: The Kubernetes release whose schemas the manifests must satisfy.
KUBERNETES_VERSION = "1.33.0"
#: Not Kubernetes API objects (Kustomization) or only a patch of one (the sidecar).
NOT_VALIDATED = ("kustomization.yaml", "sidecar/")
_DEFINITIONS_REFS = ('"/api/_definitions.json#', '"https://kubernetes.io/api/_definitions.json#')


def manifest_files() -> list[Path]:
    """Every manifest kubeconform can check as a whole object."""
    found = [*sorted(K8S_DIR.rglob("*.yaml")), POD_TEMPLATE]
    return [p for p in found if not any(part in p.relative_to(DEPLOY).as_posix() for part in NOT_VALIDATED)]


def load_documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def bundled_schemas(version: str = KUBERNETES_VERSION) -> Path | None:
    """kubernetes-validate's strict schema directory for ``version``, if the package is installed."""
    spec = importlib.util.find_spec("kubernetes_validate")
    if spec is None or not spec.submodule_search_locations:
        return None
    directory = Path(next(iter(spec.submodule_search_locations))) / "kubernetes-json-schema"
    directory /= f"v{version}-local-strict"
    return directory if directory.is_dir() else None


def prepare_schemas(source: Path, target: Path) -> Path:
    """Copy ``source`` (and kpmon's CRD schemas) into ``target`` with definitions referenced as a local file."""
    target.mkdir(parents=True, exist_ok=True)
    local = f'"{(target / "_definitions.json").as_uri()}#'
    for schema in [*sorted(source.glob("*.json")), *sorted(CRD_SCHEMAS.glob("*.json"))]:
        text = schema.read_text()
        for ref in _DEFINITIONS_REFS:
            text = text.replace(ref, local)
        (target / schema.name).write_text(text)
    return target


def find_kubeconform() -> str | None:
    for directory in (kpmon_home() / "bin", Path(os.environ.get("GOPATH", Path.home() / "go")) / "bin"):
        candidate = directory / "kubeconform"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return shutil.which("kubeconform")


def kubeconform_argv(binary: str, schema_dir: Path, files: list[str]) -> list[str]:
    return [
        binary,
        "-strict",
        "-summary",
        "-kubernetes-version",
        KUBERNETES_VERSION,
        "-schema-location",
        f"{schema_dir}/{{{{ .ResourceKind }}}}{{{{ .KindSuffix }}}}.json",
        "-skip",
        "Kustomization",
        *files,
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deploy.manifests", description=__doc__.split("\n")[0])
    parser.add_argument("files", nargs="*", help="manifests (default: deploy/k8s and the spark pod template)")
    args = parser.parse_args(argv)
    binary = find_kubeconform()
    source = bundled_schemas()
    if binary is None or source is None:
        missing = [
            name for name, found in (("kubeconform", binary), ("kubernetes-validate", source)) if not found
        ]
        print(f"error: {' and '.join(missing)} not installed; see `python -m deploy.manifests --help`")
        print(__doc__)
        return 2
    schema_dir = prepare_schemas(source, kpmon_home() / "cache" / "k8s-schemas" / f"v{KUBERNETES_VERSION}")
    files = args.files or [str(p) for p in manifest_files()]
    return subprocess.run(kubeconform_argv(binary, schema_dir, files), check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
