"""Data Docs for the quality gate: which validation results are kept, and rendering them off the batch.

Rendering is slow: GX reads back every kept result to build the index and renders a page per
result. That is seconds for a few hundred results on 2 cores (``benchmarks/quality_bench.py``), too
long to hold up a micro-batch. So ``DocsSite.render_soon`` renders in a background thread, with a GX
context of its own, from a snapshot of the results directory made of hard links. The batch thread
goes on writing and pruning results meanwhile; the snapshot cannot change under the renderer, and
never holds a half-written file, because the snapshot is taken on the batch thread between writes.

Layout under ``docs_dir``: ``results/`` (kept validation results, GX's JSON), ``.snapshot/`` (the
renderer's frozen copy), ``site/index.html`` (the report).
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
import shutil
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import great_expectations as gx
from great_expectations.core.expectation_validation_result import ExpectationSuiteValidationResult
from great_expectations.core.run_identifier import RunIdentifier
from great_expectations.data_context import AbstractDataContext
from great_expectations.data_context.types.base import (
    DataContextConfig,
    InMemoryStoreBackendDefaults,
    ProgressBarsConfig,
)
from great_expectations.data_context.types.resource_identifiers import (
    ExpectationSuiteIdentifier,
    ValidationResultIdentifier,
)

from kpconfig.model import QualityConfig

log = logging.getLogger(__name__)

SITE_NAME = "kpmon"


def context_config(results_dir: Path | None = None, site_dir: Path | None = None) -> DataContextConfig:
    """An ephemeral context's config; validation results on disk and a docs site when dirs are given."""
    config = DataContextConfig(
        store_backend_defaults=InMemoryStoreBackendDefaults(init_temp_docs_sites=False),
        analytics_enabled=False,
        # GX draws a tqdm bar per validation otherwise, into the job's terminal.
        progress_bars=ProgressBarsConfig(globally=False, metric_calculations=False),
    )
    assert config.stores is not None
    if results_dir is not None:
        config.stores[config.validation_results_store_name]["store_backend"] = {
            "class_name": "TupleFilesystemStoreBackend",
            "base_directory": str(results_dir),
        }
    if site_dir is not None:
        config.data_docs_sites = {
            SITE_NAME: {
                "class_name": "SiteBuilder",
                "show_how_to_buttons": False,
                "store_backend": {
                    "class_name": "TupleFilesystemStoreBackend",
                    "base_directory": str(site_dir),
                },
                "site_index_builder": {"class_name": "DefaultSiteIndexBuilder"},
            }
        }
    return config


def _link_tree(source: Path, target: Path) -> int:
    """Mirror ``source`` into ``target`` with hard links (a copy where linking is refused).

    Returns how many validation results (JSON files) it holds."""
    count = 0
    for root, _dirs, files in os.walk(source):
        into = target / Path(root).relative_to(source)
        into.mkdir(parents=True, exist_ok=True)
        for name in files:
            try:
                os.link(Path(root) / name, into / name)
            except OSError:
                shutil.copy2(Path(root) / name, into / name)
            count += name.endswith(".json")
    return count


class DocsSite:
    """Keeps suite results for the docs (failures always, passes sampled, bounded) and renders them."""

    def __init__(
        self,
        config: QualityConfig,
        docs_dir: Path,
        context: AbstractDataContext,
        add_suites: Callable[[AbstractDataContext], object],
    ) -> None:
        self.config = config
        self.results_dir = docs_dir / "results"
        self.site_dir = docs_dir / "site"
        self._snapshot_dir = docs_dir / ".snapshot"
        #: The gate's context: its validation results store writes to ``results_dir``.
        self._store = context.validation_results_store
        self._renderer = gx.get_context(
            project_config=context_config(self._snapshot_dir, self.site_dir), mode="ephemeral"
        )
        add_suites(self._renderer)
        self._kept: dict[str, deque[ValidationResultIdentifier]] = {}
        self._thread: threading.Thread | None = None
        #: Outcome of the newest finished render: elapsed_s, results, error (None when it worked).
        self.last_render: dict[str, Any] = {}
        self._load()

    @property
    def index(self) -> Path:
        return self.site_dir / "index.html"

    # -- keeping results -------------------------------------------------------------------------

    def keep(
        self, suite_name: str, batch_id: int, result: ExpectationSuiteValidationResult, sample: bool
    ) -> None:
        if result.success and not sample:
            return
        run_id = RunIdentifier(run_name=f"batch-{batch_id}", run_time=datetime.datetime.now(datetime.UTC))
        suite_id = ExpectationSuiteIdentifier(name=suite_name)
        key = ValidationResultIdentifier(
            expectation_suite_identifier=suite_id, run_id=run_id, batch_identifier=f"batch-{batch_id}"
        )
        try:
            self._store.store_validation_results(
                suite_validation_result=result,
                suite_validation_result_identifier=key,
                expectation_suite_identifier=suite_id,
            )
        except OSError as exc:
            log.error("quality: cannot keep results of batch %s for the docs: %s", batch_id, exc)
            return
        kept = self._kept.setdefault(suite_name, deque())
        kept.append(key)
        # Pruning sweeps the results directory, so it runs once per 10% of overshoot, not per batch.
        if len(kept) > self.config.docs_keep_results * 1.1:
            self._prune()

    def _load(self) -> None:
        keys = [k for k in self._store.list_keys() if isinstance(k, ValidationResultIdentifier)]
        keys.sort(key=lambda k: str(k.run_id.run_time))
        for key in keys:
            self._kept.setdefault(key.expectation_suite_identifier.name, deque()).append(key)
        self._prune()

    def _prune(self) -> None:
        """Drop the oldest kept results beyond ``docs_keep_results`` per suite."""
        removed = False
        for kept in self._kept.values():
            while len(kept) > self.config.docs_keep_results:
                try:
                    self._store.remove_key(kept.popleft())
                    removed = True
                except OSError as exc:
                    log.warning("quality: cannot prune a kept validation result: %s", exc)
        if not removed:
            return
        # GX leaves each removed run's directories behind, empty; they would accumulate forever.
        for root, _dirs, _files in os.walk(self.results_dir, topdown=False):
            if Path(root) != self.results_dir:
                with contextlib.suppress(OSError):
                    os.rmdir(root)

    # -- rendering -------------------------------------------------------------------------------

    @property
    def rendering(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def render_soon(self) -> bool:
        """Start rendering in the background; False (nothing started) while a render is running."""
        if self.rendering:
            return False
        results = self._snapshot()
        self._thread = threading.Thread(
            target=self._render, args=(results,), name="kpmon-quality-docs", daemon=True
        )
        self._thread.start()
        return True

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for a background render; True when none is running any more."""
        if self._thread is not None:
            self._thread.join(timeout)
        return not self.rendering

    def render_now(self, timeout: float | None = None) -> Path:
        """Render in this thread, after any background render; returns index.html."""
        if not self.wait(timeout):
            raise TimeoutError(f"a Data Docs render is still running after {timeout} s")
        self._render(self._snapshot())
        if self.last_render.get("error"):
            raise RuntimeError(f"Data Docs render failed: {self.last_render['error']}")
        return self.index

    def _snapshot(self) -> int:
        shutil.rmtree(self._snapshot_dir, ignore_errors=True)
        self.results_dir.mkdir(parents=True, exist_ok=True)
        return _link_tree(self.results_dir, self._snapshot_dir)

    def _render(self, results: int) -> None:
        start = time.perf_counter()
        error: str | None = None
        try:
            # Pages of pruned results would linger (and grow without bound) if the site were not
            # rebuilt from scratch: the results are the source of truth.
            shutil.rmtree(self.site_dir / "validations", ignore_errors=True)
            self._renderer.build_data_docs(site_names=[SITE_NAME])
        except Exception as exc:
            # Documentation is a by-product: a failed render is logged, and the next one retries.
            error = f"{type(exc).__name__}: {exc}"
            log.error("quality: Data Docs render failed: %s", error, exc_info=True)
        self.last_render = {
            "elapsed_s": round(time.perf_counter() - start, 3),
            "results": results,
            "error": error,
        }
