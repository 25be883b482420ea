//! `kpmon_tapcore.TapCore`: the per-connection core (`connection`) behind `tap.core.TapCore`. A frame
//! costs no Python object unless it is slow: Python objects are made only for slow frames, the
//! records handed back and `counters()`.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyMapping, PyTuple};

use crate::binding::{frame_error, with_bytes, PyHeldBudget};
use crate::connection::{Core, OwnedPart, Policy, Settings, Tables, PRODUCE};
use crate::correlations::{Budget, Limits};
use crate::peek::ProduceTable;
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

/// `tap.core.CoreTables` read into the core's own tables once per tables object (a process builds
/// one), so a connection costs no conversion. The object is held with them: its identity is the key.
static TABLES: Mutex<Vec<(Py<PyAny>, Arc<Tables>)>> = Mutex::new(Vec::new());
/// Distinct tables objects remembered (tests build a few; the tap one).
const TABLES_KEPT: usize = 16;

fn tables_from_py(obj: &Bound<'_, PyAny>) -> PyResult<Arc<Tables>> {
    let py = obj.py();
    {
        let cache = TABLES.lock().expect("tables lock");
        if let Some((_, found)) = cache.iter().find(|(o, _)| o.bind(py).is(obj)) {
            return Ok(found.clone());
        }
    }
    let request_headers: HashMap<(i64, i64), i64> =
        obj.getattr(intern!(py, "request_header_versions"))?.extract()?;
    let produce = ProduceTable {
        header_versions: request_headers
            .iter()
            .filter(|((api, _), _)| *api == PRODUCE)
            .map(|((_, v), hv)| (*v, *hv))
            .collect(),
        acks_layouts: obj.getattr(intern!(py, "produce_acks"))?.extract()?,
    };
    let mut plans = HashMap::new();
    let strip_plans = obj.getattr(intern!(py, "strip_plans"))?;
    for item in strip_plans.cast::<PyMapping>()?.items()?.iter() {
        let (key, value): ((i64, bool, i64), Bound<'_, PyAny>) = item.extract()?;
        plans.insert(key, plan(&value, 0)?);
    }
    let records: HashSet<(i64, bool)> = plans.keys().map(|(api, request, _)| (*api, *request)).collect();
    // The SASL v0 token rounds are `tap.framing.SaslState`'s, read from there unless the tables carry them.
    let framing = py.import("tap.framing")?;
    let sasl_rounds: HashMap<String, i64> = match obj.getattr_opt(intern!(py, "sasl_rounds"))? {
        Some(rounds) => rounds.extract()?,
        None => framing.getattr("SASL_ROUNDS")?.extract()?,
    };
    let sasl_other_rounds: i64 = framing.getattr("FOREVER")?.extract()?;
    let tables = Arc::new(Tables {
        request_headers,
        response_headers: obj.getattr(intern!(py, "response_header_versions"))?.extract()?,
        produce,
        error_offsets: obj.getattr(intern!(py, "error_offsets"))?.extract()?,
        strip_plans: plans,
        records,
        slow: obj.getattr(intern!(py, "slow"))?.extract()?,
        sasl_rounds,
        sasl_other_rounds,
        latency_buckets_ns: obj.getattr(intern!(py, "latency_buckets_ns"))?.extract()?,
        rebalance_waits: obj.getattr(intern!(py, "rebalance_waits"))?.extract()?,
    });
    let mut cache = TABLES.lock().expect("tables lock");
    if cache.len() >= TABLES_KEPT {
        cache.remove(0);
    }
    cache.push((obj.clone().unbind(), tables.clone()));
    Ok(tables)
}

fn settings_from_py(obj: &Bound<'_, PyAny>) -> PyResult<Settings> {
    let hold = obj.getattr("hold_limits")?;
    let flush = obj.getattr("flush")?;
    let capture: String = obj.getattr("capture")?.extract()?;
    Ok(Settings {
        policy: policy(&capture)?,
        mirror: obj.getattr("mirror")?.is_truthy()?,
        max_mirrored: obj.getattr("max_mirrored_frame_bytes")?.extract()?,
        max_frame: obj.getattr("max_frame_bytes")?.extract()?,
        retain: obj.getattr("retain")?.extract()?,
        head_bytes: obj.py().import("tap.framing")?.getattr("HEAD_BYTES")?.extract()?,
        hold: Limits {
            max_in_flight: hold.getattr("max_in_flight")?.extract()?,
            max_bytes: hold.getattr("max_bytes")?.extract()?,
            max_age_ns: hold.getattr("max_age_ns")?.extract()?,
            max_rebalance_age_ns: hold.getattr("max_rebalance_age_ns")?.extract()?,
        },
        flush_max_bytes: flush.getattr("max_bytes")?.extract()?,
        flush_max_entries: flush.getattr("max_entries")?.extract()?,
        flush_max_age_ns: flush.getattr("max_age_ns")?.extract()?,
    })
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

type Record<'py> = Option<(Bound<'py, PyBytes>, usize)>;

fn record(py: Python<'_>, found: Option<(Vec<u8>, usize)>) -> Record<'_> {
    found.map(|(value, n)| (PyBytes::new(py, &value), n))
}

fn optional_part(part: Option<&Bound<'_, PyAny>>) -> PyResult<Option<OwnedPart>> {
    match part {
        Some(p) if !p.is_none() => Ok(Some(part_from_py(p)?)),
        _ => Ok(None),
    }
}

#[pymethods]
impl PyTapCore {
    #[new]
    #[pyo3(signature = (tables, settings, static_, budget = None))]
    fn new(
        tables: &Bound<'_, PyAny>,
        settings: &Bound<'_, PyAny>,
        static_: &Bound<'_, PyAny>,
        budget: Option<PyRef<'_, PyHeldBudget>>,
    ) -> PyResult<Self> {
        let budget = match budget {
            Some(b) => b.inner.clone(),
            None => Budget::new(1 << 62),
        };
        let static_ = with_bytes(static_, <[u8]>::to_vec)?;
        Ok(PyTapCore {
            inner: Core::new(
                tables_from_py(tables)?,
                settings_from_py(settings)?,
                static_,
                budget,
            ),
        })
    }

    /// Frames `data` completed and the core handled; stops at a slow frame. Raises FrameError (made
    /// once the core is no longer borrowed: making it runs Python code).
    fn feed(
        slf: &Bound<'_, Self>,
        from_client: bool,
        data: &Bound<'_, PyAny>,
        wall_ns: i64,
        mono_ns: i64,
        inside_ns: i64,
    ) -> PyResult<usize> {
        let done = {
            let mut this = slf.borrow_mut();
            with_bytes(data, |bytes| {
                this.inner.feed(from_client, bytes, wall_ns, mono_ns, inside_ns)
            })?
        };
        done.map_err(|e| frame_error(slf.py(), &e))
    }

    /// The frame waiting for `resolve` (a `tap.core.SlowFrame`), or None.
    fn slow<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        let Some(s) = self.inner.slow() else {
            return Ok(None);
        };
        let cls = py
            .import(intern!(py, "tap.core"))?
            .getattr(intern!(py, "SlowFrame"))?;
        let frame = cls.call1((
            s.from_client,
            PyBytes::new(py, &s.head),
            s.size,
            s.api_key,
            s.api_version,
            s.correlation_id,
            s.sensitive,
            s.wall_ns,
        ))?;
        Ok(Some(frame))
    }

    /// The part is read before the core is borrowed: reading it may run Python code, and the metrics
    /// thread may then read `counters()`.
    #[pyo3(signature = (part, mechanism = None, sensitive = false))]
    fn resolve(
        slf: &Bound<'_, Self>,
        part: Option<&Bound<'_, PyAny>>,
        mechanism: Option<String>,
        sensitive: bool,
    ) -> PyResult<()> {
        let part = optional_part(part)?;
        if slf.borrow_mut().inner.resolve(part, mechanism, sensitive) {
            Ok(())
        } else {
            Err(PyRuntimeError::new_err("no slow frame to resolve"))
        }
    }

    fn pending(&self, correlation_id: i64) -> Option<(i64, i64)> {
        self.inner.pending(correlation_id)
    }

    fn lifecycle(
        slf: &Bound<'_, Self>,
        kind: String,
        part: Option<&Bound<'_, PyAny>>,
        mono_ns: i64,
    ) -> PyResult<()> {
        let part = optional_part(part)?;
        slf.borrow_mut().inner.lifecycle(kind, part, mono_ns);
        Ok(())
    }

    fn expire(&mut self, mono_ns: i64) {
        self.inner.expire(mono_ns);
    }

    fn drain(&mut self, mono_ns: i64) {
        self.inner.drain(mono_ns);
    }

    fn take_record<'py>(&mut self, py: Python<'py>, lost: i64, loss_ns: i64) -> Record<'py> {
        record(py, self.inner.take_record(lost, loss_ns))
    }

    fn flush<'py>(&mut self, py: Python<'py>, lost: i64, loss_ns: i64) -> Record<'py> {
        record(py, self.inner.flush(lost, loss_ns))
    }

    fn due_ns(&self) -> Option<i64> {
        self.inner.due_ns()
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

    /// A `tap.core.CoreCounters`, read on the metrics server's thread: the counts are copied before
    /// any Python code runs, so the event loop's `feed` never finds the core borrowed.
    fn counters<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        let (c, held_bytes) = {
            let this = slf.borrow();
            (this.inner.counters.clone(), this.inner.held_bytes())
        };
        let frames = PyDict::new(py);
        for ((request, api_key, api_version), (n, bytes)) in &c.frames {
            frames.set_item(
                (if *request { "req" } else { "resp" }, *api_key, *api_version),
                (*n, *bytes),
            )?;
        }
        let errors = PyDict::new(py);
        for (key, n) in &c.errors {
            errors.set_item(*key, *n)?;
        }
        let lone = PyDict::new(py);
        for (reason, n) in &c.lone {
            lone.set_item(*reason, *n)?;
        }
        let latency = PyDict::new(py);
        for (key, h) in &c.latency {
            latency.set_item(*key, (PyTuple::new(py, &h.buckets)?, h.sum))?;
        }
        let kwargs = PyDict::new(py);
        kwargs.set_item("frames", frames)?;
        kwargs.set_item("errors", errors)?;
        kwargs.set_item("lone", lone)?;
        kwargs.set_item("truncated", c.truncated)?;
        kwargs.set_item("latency", latency)?;
        kwargs.set_item("held_bytes", held_bytes)?;
        kwargs.set_item("slow", c.slow)?;
        let cls = py
            .import(intern!(py, "tap.core"))?
            .getattr(intern!(py, "CoreCounters"))?;
        cls.call((), Some(&kwargs))
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyTapCore>()?;
    Ok(())
}
