"""streaming.workergc: the job's Python workers' collector settings, applied once per process."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pyarrow as pa
import pytest

from streaming import workergc


@pytest.fixture
def restored_gc(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    thresholds = gc.get_threshold()
    monkeypatch.setattr(workergc, "_tuned", False)
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*thresholds)


@pytest.mark.usefixtures("restored_gc")
def test_the_first_call_freezes_and_raises_the_thresholds_the_next_ones_change_nothing() -> None:
    assert workergc.tune_worker_gc() is True
    assert gc.get_threshold() == (
        workergc.GEN0_THRESHOLD,
        workergc.GEN1_THRESHOLD,
        workergc.GEN2_THRESHOLD,
    )
    frozen = gc.get_freeze_count()
    assert frozen > 0
    gc.set_threshold(700, 10, 10)
    assert workergc.tune_worker_gc() is False
    assert gc.get_threshold() == (700, 10, 10)
    # Not frozen again: a second freeze would add every object made since. (Frozen objects that
    # are freed meanwhile leave the count, so it may fall.)
    assert gc.get_freeze_count() <= frozen


@pytest.mark.parametrize("worker_gc", [True, False])
def test_the_job_tunes_its_stateful_workers_as_configured(worker_gc: bool) -> None:
    pytest.importorskip("pyspark")
    from kpconfig.model import KpmonConfig
    from streaming.job import stage_processor

    config = KpmonConfig()
    assert config.stream.worker_gc is True
    config = config.model_copy(update={"stream": config.stream.model_copy(update={"worker_gc": worker_gc})})
    assert stage_processor(config).tune_gc == worker_gc


@pytest.mark.usefixtures("restored_gc")
@pytest.mark.parametrize("worker_gc", [True, False])
def test_the_job_tunes_its_routing_workers_as_configured(worker_gc: bool) -> None:
    # The mapInArrow workers allocate per frame as the stateful ones do: one setting for both.
    pytest.importorskip("pyspark")
    from kpconfig.model import KpmonConfig
    from streaming.job import bundle_function

    config = KpmonConfig()
    config = config.model_copy(update={"stream": config.stream.model_copy(update={"worker_gc": worker_gc})})
    gc.set_threshold(700, 10, 10)
    assert list(bundle_function(config)([])) == []
    tuned = (workergc.GEN0_THRESHOLD, workergc.GEN1_THRESHOLD, workergc.GEN2_THRESHOLD)
    assert gc.get_threshold() == (tuned if worker_gc else (700, 10, 10))


def test_processors_made_elsewhere_leave_the_collector_alone() -> None:
    # Tests and tools build processors in processes that are not Spark's workers.
    pytest.importorskip("pyspark")
    from kpconfig.model import KpmonConfig
    from streaming.processors import MonitorProcessor

    assert not MonitorProcessor(KpmonConfig().checks.settings()).tune_gc


@pytest.mark.parametrize("paused", [True, False])
def test_the_collector_is_paused_only_while_asked_and_back_after_an_error(paused: bool) -> None:
    assert gc.isenabled()
    with pytest.raises(RuntimeError), workergc.collector_paused(paused):
        assert gc.isenabled() is not paused
        raise RuntimeError("a batch that fails")
    assert gc.isenabled()


def test_a_collector_disabled_by_the_caller_stays_disabled() -> None:
    gc.disable()
    try:
        with workergc.collector_paused(True):
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()


@pytest.mark.usefixtures("restored_gc")
@pytest.mark.parametrize("tune_gc", [True, False])
def test_routing_pauses_the_collector_for_each_batch_when_tuned(
    tune_gc: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    from streaming import bundles

    seen: list[bool] = []

    def bundle_batch(config: object, batch: object, labels: object) -> object:
        seen.append(gc.isenabled())
        return batch

    monkeypatch.setattr(bundles, "bundle_batch", bundle_batch)
    batches = [pa.RecordBatch.from_pydict({"n": [1]}), pa.RecordBatch.from_pydict({"n": [2]})]
    out = bundles.bundle_batches(None, [0], tune_gc, 1, batches)  # type: ignore[arg-type]
    assert list(out) == batches
    assert seen == [not tune_gc] * 2
    assert gc.isenabled()
