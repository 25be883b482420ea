//! `kpmon_tapcore.TapCore` and `TapTables`: the per-connection core (`core`) exposed to Python. A frame
//! costs no Python object unless it is slow; Python objects are made only for slow frames, lifecycle
//! parts, the records handed back and `counters()`.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyMapping, PyTuple};

use crate::binding::{frame_error, with_bytes, PyHeldBudget, PyProduceTable};
use crate::connection::{Core, CoreError, OwnedPart, Policy, Settings, Tables};
use crate::correlations::{Budget, Limits};
use crate::strip::Step;

fn step(obj: &Bound<'_, PyAny>, depth: u32) -> PyResult<Step> {
    if depth > 64 {
        return Err(PyValueError::new_err("strip plan nested too deeply"));
    }
    let t = obj.cast::<PyTuple>()?;
    let kind: u8 = t.get_item(0)?.extract()?;
    Ok(match kind {
        0 => Step::Fixed(t.get_item(1)?.extract()?),
        1 => Step::Sized {
            flexible: t.get_item(1)?.is_truthy()?,
            width: t.get_item(2)?.extract()?,
        },
        2 => Step::Records {
            flexible: t.get_item(1)?.is_truthy()?,
        },
        3 => Step::Array {
            flexible: t.get_item(1)?.is_truthy()?,
            plan: plan(&t.get_item(2)?, depth + 1)?,
        },
        4 => Step::Struct(plan(&t.get_item(1)?, depth + 1)?),
        5 => Step::Tags,
        other => return Err(PyValueError::new_err(format!("unknown strip step {other}"))),
    })
}

fn plan(obj: &Bound<'_, PyAny>, depth: u32) -> PyResult<Vec<Step>> {
    obj.try_iter()?.map(|s| step(&s?, depth)).collect()
}

/// The core's protocol tables (`tap.native_core.core_tables` builds them from the codec's schema).
#[pyclass(name = "TapTables", module = "kpmon_tapcore", frozen)]
pub struct PyTapTables {
    inner: Arc<Tables>,
}

#[pymethods]
impl PyTapTables {
    #[new]
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (*, request_headers, response_headers, produce, error_offsets, strip_plans, records, slow,
                        slow_request_versions, sasl_rounds, sasl_handshake, produce_key, latency_buckets,
                        rebalance_waits))]
    fn new(
        request_headers: HashMap<(i64, i64), i64>,
        response_headers: HashMap<(i64, i64), i64>,
        produce: PyRef<'_, PyProduceTable>,
        error_offsets: HashMap<i64, (i64, usize)>,
        strip_plans: &Bound<'_, PyMapping>,
        records: HashSet<(i64, bool)>,
        slow: HashSet<(i64, bool)>,
        slow_request_versions: HashSet<(i64, i64)>,
        sasl_rounds: HashMap<String, i64>,
        sasl_handshake: i64,
        produce_key: i64,
        latency_buckets: Vec<f64>,
        rebalance_waits: Vec<i64>,
    ) -> PyResult<Self> {
        let mut plans = HashMap::new();
        for item in strip_plans.items()?.iter() {
            let (key, value): ((i64, bool, i64), Bound<'_, PyAny>) = item.extract()?;
            plans.insert(key, plan(&value, 0)?);
        }
        Ok(PyTapTables {
            inner: Arc::new(Tables {
                request_headers,
                response_headers,
                produce: produce.inner.clone(),
                error_offsets,
                strip_plans: plans,
                records,
                slow,
                slow_request_versions,
                sasl_rounds,
                sasl_handshake,
                produce_key,
                latency_buckets,
                rebalance_waits,
            }),
        })
    }

    #[getter]
    fn strip_plans(&self) -> usize {
        self.inner.strip_plans.len()
    }
}

/// A frame the core hands to Python (`TapCore.slow()`).
#[pyclass(name = "SlowFrame", module = "kpmon_tapcore", frozen, get_all)]
pub struct PySlowFrame {
    from_client: bool,
    direction: &'static str,
    head: Py<PyBytes>,
    size: i64,
    complete: bool,
    api_key: Option<i64>,
    api_version: Option<i64>,
    correlation_id: Option<i64>,
    sensitive: bool,
    wall_ns: i64,
}

fn part_from_py(obj: &Bound<'_, PyAny>) -> PyResult<OwnedPart> {
    let direction: String = obj.getattr("direction")?.extract()?;
    let redacted: Vec<String> = obj.getattr("redacted")?.extract()?;
    let flags_obj = obj.getattr("flags")?;
    let mut flags = Vec::new();
    for item in flags_obj.call_method0("items")?.try_iter()? {
        let (k, v): (String, String) = item?.extract()?;
        flags.push((Cow::Owned(k), v));
    }
    let value = obj.getattr("value")?;
    let value = if value.is_none() {
        Vec::new()
    } else {
        with_bytes(&value, <[u8]>::to_vec)?
    };
    Ok(OwnedPart {
        direction: Cow::Owned(direction),
        ts_ns: obj.getattr("ts_ns")?.extract()?,
        api_key: obj.getattr("api_key")?.extract()?,
        api_version: obj.getattr("api_version")?.extract()?,
        correlation_id: obj.getattr("correlation_id")?.extract()?,
        redacted: Cow::Owned(redacted.join(",")),
        flags,
        value,
    })
}

fn state_error(err: CoreError, py: Python<'_>) -> PyErr {
    match err {
        CoreError::Frame(e) => frame_error(py, &e),
        CoreError::State(why) => PyRuntimeError::new_err(why),
    }
}

fn policy(name: &str) -> PyResult<Policy> {
    match name {
        "full" => Ok(Policy::Full),
        "headers" => Ok(Policy::Headers),
        "meta" => Ok(Policy::Meta),
        other => Err(PyValueError::new_err(format!("unknown capture policy {other:?}"))),
    }
}

/// One connection's core: `tap.core.TapCore`, native.
#[pyclass(name = "TapCore", module = "kpmon_tapcore")]
pub struct PyTapCore {
    inner: Core,
}

#[pymethods]
impl PyTapCore {
    #[new]
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (tables, static_, *, policy, mirror, max_mirrored_frame_bytes, max_frame_bytes,
                        hold_limits, flush_limits, budget = None))]
    fn new(
        tables: PyRef<'_, PyTapTables>,
        static_: &Bound<'_, PyAny>,
        policy: &str,
        mirror: bool,
        max_mirrored_frame_bytes: i64,
        max_frame_bytes: i64,
        hold_limits: (i64, i64, i64, i64),
        flush_limits: (i64, usize, i64),
        budget: Option<PyRef<'_, PyHeldBudget>>,
    ) -> PyResult<Self> {
        let settings = Settings {
            policy: self::policy(policy)?,
            mirror,
            max_mirrored: max_mirrored_frame_bytes,
            max_frame: max_frame_bytes,
            hold: Limits {
                max_in_flight: hold_limits.0,
                max_bytes: hold_limits.1,
                max_age_ns: hold_limits.2,
                max_rebalance_age_ns: hold_limits.3,
            },
            flush_max_bytes: flush_limits.0,
            flush_max_entries: flush_limits.1,
            flush_max_age_ns: flush_limits.2,
        };
        let budget = match budget {
            Some(b) => b.inner.clone(),
            None => Budget::new(1 << 62),
        };
        let static_ = with_bytes(static_, <[u8]>::to_vec)?;
        Ok(PyTapCore {
            inner: Core::new(tables.inner.clone(), settings, static_, budget),
        })
    }

    /// Frames `data` completed and the core handled; stops at a slow frame. Raises FrameError.
    fn feed(&mut self, py: Python<'_>, from_client: bool, data: &Bound<'_, PyAny>, wall_ns: i64, mono_ns: i64) -> PyResult<usize> {
        let inner = &mut self.inner;
        with_bytes(data, |bytes| inner.feed(from_client, bytes, wall_ns, mono_ns))?.map_err(|e| state_error(e, py))
    }

    fn slow(&self, py: Python<'_>) -> Option<PySlowFrame> {
        self.inner.slow().map(|s| PySlowFrame {
            from_client: s.from_client,
            direction: if s.from_client { "req" } else { "resp" },
            head: PyBytes::new(py, &s.head).unbind(),
            size: s.size,
            complete: s.head.len() as i64 == s.size,
            api_key: s.api_key,
            api_version: s.api_version,
            correlation_id: s.correlation_id,
            sensitive: s.sensitive,
            wall_ns: s.wall_ns,
        })
    }

    /// Python's capture of the slow frame; a SaslHandshake v0 request's mechanism (`has_mechanism`),
    /// an Envelope request's `sensitive`.
    #[pyo3(signature = (part, *, sensitive = false, has_mechanism = false, mechanism = None))]
    fn resolve(
        &mut self,
        py: Python<'_>,
        part: &Bound<'_, PyAny>,
        sensitive: bool,
        has_mechanism: bool,
        mechanism: Option<String>,
    ) -> PyResult<()> {
        let part = if part.is_none() { None } else { Some(part_from_py(part)?) };
        let mechanism = has_mechanism.then_some(mechanism);
        self.inner.resolve(part, sensitive, mechanism).map_err(|e| state_error(e, py))
    }

    fn lifecycle(&mut self, kind: String, part: &Bound<'_, PyAny>, mono_ns: i64) -> PyResult<()> {
        let part = if part.is_none() { None } else { Some(part_from_py(part)?) };
        self.inner.lifecycle(kind, part, mono_ns);
        Ok(())
    }

    fn expire(&mut self, mono_ns: i64) {
        self.inner.expire(mono_ns);
    }

    fn drain(&mut self, mono_ns: i64) {
        self.inner.drain(mono_ns);
    }

    /// The records due by the size or count bound, oldest first: (value, entries) each.
    fn take_records<'py>(&mut self, py: Python<'py>, lost: i64, loss_ns: i64) -> PyResult<Bound<'py, PyList>> {
        let out = PyList::empty(py);
        while let Some((value, n)) = self.inner.take_record(lost, loss_ns) {
            out.append((PyBytes::new(py, &value), n))?;
        }
        Ok(out)
    }

    /// The next record due, or None.
    fn take_record<'py>(&mut self, py: Python<'py>, lost: i64, loss_ns: i64) -> Option<(Bound<'py, PyBytes>, usize)> {
        self.inner.take_record(lost, loss_ns).map(|(v, n)| (PyBytes::new(py, &v), n))
    }

    #[getter]
    fn records_due(&self) -> usize {
        self.inner.records_due()
    }

    fn flush<'py>(&mut self, py: Python<'py>, lost: i64, loss_ns: i64) -> Option<(Bound<'py, PyBytes>, usize)> {
        self.inner.flush(lost, loss_ns).map(|(v, n)| (PyBytes::new(py, &v), n))
    }

    fn due_ns(&self) -> Option<i64> {
        self.inner.due_ns()
    }

    fn pending_api(&self, corr: i64) -> Option<i64> {
        self.inner.pending_api(corr)
    }

    #[getter]
    fn seq(&self) -> i64 {
        self.inner.seq
    }

    #[getter]
    fn client_name<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.inner.client_name)
    }

    #[getter]
    fn mid_frame(&self) -> bool {
        self.inner.mid_frame()
    }

    #[getter]
    fn held_bytes(&self) -> i64 {
        self.inner.held_bytes()
    }

    #[getter]
    fn in_flight(&self) -> usize {
        self.inner.in_flight()
    }

    /// `{"frames": {(dir, api_key, api_version): (frames, bytes)}, "errors": {(api_key, code): n},
    /// "lone": {reason: n}, "truncated": n, "latency": {(api_key, broker): (buckets, sum, count)},
    /// "held_bytes": n}`, buckets not cumulative, the last +Inf.
    fn counters<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let c = &self.inner.counters;
        let out = PyDict::new(py);
        let frames = PyDict::new(py);
        for ((request, api_key, api_version), (n, bytes)) in &c.frames {
            frames.set_item((if *request { "req" } else { "resp" }, *api_key, *api_version), (*n, *bytes))?;
        }
        out.set_item("frames", frames)?;
        let errors = PyDict::new(py);
        for (key, n) in &c.errors {
            errors.set_item(*key, *n)?;
        }
        out.set_item("errors", errors)?;
        let lone = PyDict::new(py);
        for (reason, n) in &c.lone {
            lone.set_item(*reason, *n)?;
        }
        out.set_item("lone", lone)?;
        out.set_item("truncated", c.truncated)?;
        let latency = PyDict::new(py);
        for (key, h) in &c.latency {
            latency.set_item(*key, (h.buckets.clone(), h.sum, h.count))?;
        }
        out.set_item("latency", latency)?;
        out.set_item("held_bytes", self.inner.held_bytes())?;
        Ok(out)
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyTapTables>()?;
    m.add_class::<PySlowFrame>()?;
    m.add_class::<PyTapCore>()?;
    Ok(())
}
