//! The Python binding (`kpmon_tapcore`): each native piece exposed for its differential test, and the
//! reference's exception types raised.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use pyo3::buffer::PyBuffer;
use pyo3::create_exception;
use pyo3::exceptions::{PyOverflowError, PyTypeError, PyValueError};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyByteArray, PyBytes, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple, PyType};

use crate::correlations::{Budget, Correlations, Limits, Pending, Reason};
use crate::{framing, msgpack, peek};

create_exception!(
    kpmon_tapcore,
    FrameError,
    PyValueError,
    "The stream is not Kafka framing."
);
create_exception!(
    kpmon_tapcore,
    DecodeError,
    PyValueError,
    "A header that cannot be read."
);

/// The exception classes raised, when Python registers its own (`use_errors`): the reference's
/// `tap.framing.FrameError` and `codec.errors.DecodeError`, so callers catch one type for both cores.
static ERRORS: Mutex<Option<(Py<PyType>, Py<PyType>)>> = Mutex::new(None);

#[pyfunction]
fn use_errors(frame_error: Bound<'_, PyType>, decode_error: Bound<'_, PyType>) {
    *ERRORS.lock().expect("errors lock") = Some((frame_error.unbind(), decode_error.unbind()));
}

fn error_types(py: Python<'_>) -> (Bound<'_, PyType>, Bound<'_, PyType>) {
    match &*ERRORS.lock().expect("errors lock") {
        Some((frame, decode)) => (frame.bind(py).clone(), decode.bind(py).clone()),
        None => (py.get_type::<FrameError>(), py.get_type::<DecodeError>()),
    }
}

pub(crate) fn frame_error(py: Python<'_>, err: &framing::FrameError) -> PyErr {
    let cls = error_types(py).0;
    match cls.call1((err.to_string(),)) {
        Ok(value) => PyErr::from_value(value),
        Err(e) => e,
    }
}

fn decode_error(py: Python<'_>, err: &peek::PeekError) -> PyErr {
    let cls = error_types(py).1;
    match cls.call1((
        err.reason.clone(),
        err.offset,
        err.api_key,
        err.api_version,
        err.what,
    )) {
        Ok(value) => PyErr::from_value(value),
        Err(e) => e,
    }
}

/// `bytes` are read in place; a `bytearray` or `memoryview` is copied first (its owner may change it).
pub(crate) fn with_bytes<R>(obj: &Bound<'_, PyAny>, f: impl FnOnce(&[u8]) -> R) -> PyResult<R> {
    if let Ok(b) = obj.cast::<PyBytes>() {
        return Ok(f(b.as_bytes()));
    }
    let buffer = PyBuffer::<u8>::get(obj)?;
    let copy = buffer.to_vec(obj.py())?;
    Ok(f(&copy))
}

// --- framing ---------------------------------------------------------------------------------------

/// `tap.framing.FrameSplitter`: `feed(chunk)` returns `(size, head)` for each frame that ended in it.
#[pyclass(name = "FrameSplitter", module = "kpmon_tapcore")]
struct PyFrameSplitter {
    inner: framing::Splitter,
}

#[pymethods]
impl PyFrameSplitter {
    #[new]
    #[pyo3(signature = (retain, max_frame = 1 << 30, head = 65_536))]
    fn new(retain: i64, max_frame: i64, head: i64) -> Self {
        PyFrameSplitter {
            inner: framing::Splitter::new(retain, max_frame, head),
        }
    }

    #[getter]
    fn mid_frame(&self) -> bool {
        self.inner.mid_frame()
    }

    fn set_retain(&mut self, retain: i64) {
        self.inner.set_retain(retain);
    }

    fn feed<'py>(&mut self, py: Python<'py>, data: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyList>> {
        let out = PyList::empty(py);
        let mut failed: PyResult<()> = Ok(());
        let result = with_bytes(data, |bytes| {
            self.inner.feed(bytes, |frame| {
                if failed.is_ok() {
                    let item = (frame.size, PyBytes::new(py, &frame.head));
                    failed = out.append(item);
                }
            })
        })?;
        failed?;
        match result {
            Ok(()) => Ok(out),
            Err(err) => Err(frame_error(py, &err)),
        }
    }
}

#[pyfunction]
fn starts_with_tls(data: &Bound<'_, PyAny>) -> PyResult<bool> {
    with_bytes(data, framing::starts_with_tls)
}

// --- header peeks ----------------------------------------------------------------------------------

/// `codec.peek.peek_request_header`: `(api_key, api_version, correlation_id, client_id, end)`.
#[pyfunction]
fn peek_request_header<'py>(
    py: Python<'py>,
    buf: &Bound<'py, PyAny>,
) -> PyResult<(i16, i16, i32, Option<String>, usize)> {
    with_bytes(buf, |bytes| match peek::peek_request_header(bytes) {
        Ok(h) => Ok((
            h.api_key,
            h.api_version,
            h.correlation_id,
            h.client_id.map(|raw| String::from_utf8_lossy(raw).into_owned()),
            h.end,
        )),
        Err(err) => Err(decode_error(py, &err)),
    })?
}

/// `codec.peek.peek_correlation_id`.
#[pyfunction]
fn peek_correlation_id(py: Python<'_>, buf: &Bound<'_, PyAny>) -> PyResult<i32> {
    with_bytes(buf, |bytes| {
        peek::peek_correlation_id(bytes).map_err(|err| decode_error(py, &err))
    })?
}

/// The Produce tables Python builds from the schema table (`tap.native_core.produce_table`):
/// `header_versions` {version: request header version} and `acks_layouts` {version: (compact,
/// strings before Acks) or None}.
#[pyclass(name = "ProduceTable", module = "kpmon_tapcore", frozen)]
pub(crate) struct PyProduceTable {
    pub(crate) inner: peek::ProduceTable,
}

#[pymethods]
impl PyProduceTable {
    #[new]
    fn new(header_versions: HashMap<i64, i64>, acks_layouts: HashMap<i64, Option<(bool, u32)>>) -> Self {
        PyProduceTable {
            inner: peek::ProduceTable {
                header_versions,
                acks_layouts,
            },
        }
    }

    /// `codec.peek.peek_produce_acks`.
    fn peek_produce_acks(
        &self,
        buf: &Bound<'_, PyAny>,
        api_version: i64,
        body: i64,
    ) -> PyResult<Option<i16>> {
        with_bytes(buf, |bytes| {
            self.inner.peek_produce_acks(bytes, api_version, body)
        })
    }

    /// `tap.framing.expects_response`.
    fn expects_response(&self, head: &Bound<'_, PyAny>, api_key: i64, api_version: i64) -> PyResult<bool> {
        with_bytes(head, |bytes| {
            self.inner.expects_response(bytes, api_key, api_version)
        })
    }
}

// --- correlations ----------------------------------------------------------------------------------

/// `tap.framing.HeldBudget`: held bytes shared by a tap's connections.
#[pyclass(name = "HeldBudget", module = "kpmon_tapcore", frozen)]
pub(crate) struct PyHeldBudget {
    pub(crate) inner: Arc<Budget>,
}

#[pymethods]
impl PyHeldBudget {
    #[new]
    fn new(limit: i64) -> Self {
        PyHeldBudget {
            inner: Budget::new(limit),
        }
    }

    #[getter]
    fn held(&self) -> i64 {
        self.inner.held()
    }

    #[getter]
    fn limit(&self) -> i64 {
        self.inner.limit()
    }

    fn take(&self, size: i64) -> bool {
        self.inner.take(size)
    }

    fn give(&self, size: i64) {
        self.inner.give(size)
    }
}

type Released = Vec<(Py<PyAny>, Reason)>;

fn released<'py>(py: Python<'py>, out: Released) -> PyResult<Bound<'py, PyList>> {
    PyList::new(py, out.into_iter().map(|(held, reason)| (held, reason.name())))
}

type PendingTuple = (i64, i64, i64, bool, Option<Py<PyAny>>);

fn pending_tuple(py: Python<'_>, p: &Pending<Py<PyAny>>) -> PendingTuple {
    (
        p.api_key,
        p.api_version,
        p.forwarded_ns,
        p.sensitive,
        p.held.as_ref().map(|h| h.clone_ref(py)),
    )
}

/// `tap.framing.Correlations`, holding any Python object as a request's held frame (its size given).
/// A pending request reads back as `(api_key, api_version, forwarded_ns, sensitive, held)`; a frame
/// handed back as `(held, reason)`.
#[pyclass(name = "Correlations", module = "kpmon_tapcore")]
struct PyCorrelations {
    inner: Correlations<Py<PyAny>>,
}

#[pymethods]
impl PyCorrelations {
    #[new]
    #[pyo3(signature = (max_in_flight, max_bytes, max_age_ns, max_rebalance_age_ns, rebalance_waits, budget = None))]
    fn new(
        max_in_flight: i64,
        max_bytes: i64,
        max_age_ns: i64,
        max_rebalance_age_ns: i64,
        rebalance_waits: Vec<i64>,
        budget: Option<PyRef<'_, PyHeldBudget>>,
    ) -> Self {
        let limits = Limits {
            max_in_flight,
            max_bytes,
            max_age_ns,
            max_rebalance_age_ns,
        };
        let budget = match budget {
            Some(b) => b.inner.clone(),
            None => Budget::new(1 << 62),
        };
        PyCorrelations {
            inner: Correlations::new(limits, budget, rebalance_waits),
        }
    }

    fn __len__(&self) -> usize {
        self.inner.len()
    }

    #[getter]
    fn held_bytes(&self) -> i64 {
        self.inner.held_bytes()
    }

    #[pyo3(signature = (corr, api_key, api_version, forwarded_ns, held = None, held_size = 0, sensitive = false))]
    #[allow(clippy::too_many_arguments)]
    fn add<'py>(
        &mut self,
        py: Python<'py>,
        corr: i64,
        api_key: i64,
        api_version: i64,
        forwarded_ns: i64,
        held: Option<Py<PyAny>>,
        held_size: i64,
        sensitive: bool,
    ) -> PyResult<Bound<'py, PyList>> {
        let mut out = Vec::new();
        let pending = Pending {
            api_key,
            api_version,
            forwarded_ns,
            sensitive,
            held,
            held_bytes: 0,
        };
        self.inner.add(corr, pending, held_size, &mut out);
        released(py, out)
    }

    fn peek(&self, py: Python<'_>, corr: i64) -> Option<PendingTuple> {
        self.inner.peek(corr).map(|p| pending_tuple(py, p))
    }

    #[pyo3(name = "match")]
    fn match_response<'py>(
        &mut self,
        py: Python<'py>,
        corr: i64,
    ) -> PyResult<(Option<PendingTuple>, Bound<'py, PyList>)> {
        let mut orphans = Vec::new();
        let found = self.inner.match_response(corr, &mut orphans);
        Ok((found.map(|p| pending_tuple(py, &p)), released(py, orphans)?))
    }

    fn expire<'py>(&mut self, py: Python<'py>, now_ns: i64) -> PyResult<Bound<'py, PyList>> {
        let mut out = Vec::new();
        self.inner.expire(now_ns, &mut out);
        released(py, out)
    }

    fn drain<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let mut out = Vec::new();
        self.inner.drain(&mut out);
        released(py, out)
    }
}

// --- msgpack and schema-3 records ------------------------------------------------------------------

/// Python's `msgpack.packb(obj, use_bin_type=True)` for None, bool, int, float, str, bytes,
/// bytearray, memoryview, list, tuple and dict.
fn pack_obj(out: &mut Vec<u8>, obj: &Bound<'_, PyAny>, depth: u32) -> PyResult<()> {
    if depth > 511 {
        return Err(PyValueError::new_err("recursion limit exceeded."));
    }
    if obj.is_none() {
        msgpack::write_nil(out);
    } else if let Ok(b) = obj.cast::<PyBool>() {
        msgpack::write_bool(out, b.is_true());
    } else if obj.is_instance_of::<PyInt>() {
        if let Ok(v) = obj.extract::<i64>() {
            msgpack::write_int(out, v);
        } else if let Ok(v) = obj.extract::<u64>() {
            msgpack::write_uint(out, v);
        } else {
            return Err(PyOverflowError::new_err("Integer value out of range"));
        }
    } else if let Ok(f) = obj.cast::<PyFloat>() {
        msgpack::write_float(out, f.value());
    } else if let Ok(b) = obj.cast::<PyBytes>() {
        msgpack::write_bin(out, b.as_bytes());
    } else if let Ok(b) = obj.cast::<PyByteArray>() {
        msgpack::write_bin(out, &b.to_vec());
    } else if let Ok(s) = obj.cast::<PyString>() {
        msgpack::write_str(out, &s.to_cow()?);
    } else if let Ok(d) = obj.cast::<PyDict>() {
        msgpack::write_map_header(out, d.len());
        for (k, v) in d.iter() {
            pack_obj(out, &k, depth + 1)?;
            pack_obj(out, &v, depth + 1)?;
        }
    } else if let Ok(l) = obj.cast::<PyList>() {
        msgpack::write_array_header(out, l.len());
        for item in l.iter() {
            pack_obj(out, &item, depth + 1)?;
        }
    } else if let Ok(t) = obj.cast::<PyTuple>() {
        msgpack::write_array_header(out, t.len());
        for item in t.iter() {
            pack_obj(out, &item, depth + 1)?;
        }
    } else if let Ok(buffer) = PyBuffer::<u8>::get(obj) {
        msgpack::write_bin(out, &buffer.to_vec(obj.py())?);
    } else {
        let name = obj.get_type().name()?;
        return Err(PyTypeError::new_err(format!("can not serialize '{name}' object")));
    }
    Ok(())
}

/// `msgpack.packb(obj, use_bin_type=True)`, for the differential tests of the writer.
#[pyfunction]
fn packb<'py>(py: Python<'py>, obj: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyBytes>> {
    let mut out = Vec::new();
    pack_obj(&mut out, obj, 0)?;
    Ok(PyBytes::new(py, &out))
}

/// `codec.taprecord.STATIC_FIELDS`, in order.
const STATIC_FIELDS: [&str; 7] = [
    "conn",
    "client",
    "broker",
    "broker_id",
    "listener",
    "tap",
    "capture",
];

/// An int that msgpack-python packs as an int (not a bool) and that fits an i64; None otherwise.
fn plain_int(obj: &Bound<'_, PyAny>) -> Option<i64> {
    if obj.is_instance_of::<PyBool>() || !obj.is_instance_of::<PyInt>() {
        return None;
    }
    obj.extract::<i64>().ok()
}

fn opt_int(obj: &Bound<'_, PyAny>) -> Option<Option<i64>> {
    if obj.is_none() {
        Some(None)
    } else {
        plain_int(obj).map(Some)
    }
}

fn plain_str(obj: &Bound<'_, PyAny>) -> Option<String> {
    obj.cast::<PyString>().ok()?.to_str().ok().map(str::to_owned)
}

/// `codec.taprecord.pack_static`: a connection's constant fields, packed once per connection.
#[pyfunction]
fn pack_static<'py>(py: Python<'py>, connection: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyBytes>> {
    let fields: Vec<Bound<'py, PyAny>> = STATIC_FIELDS
        .iter()
        .map(|name| connection.getattr(*name))
        .collect::<PyResult<_>>()?;
    let texts: Vec<Option<String>> = fields.iter().map(plain_str).collect();
    let broker_id = opt_int(&fields[3]);
    let listener = if fields[4].is_none() {
        Some(None)
    } else {
        texts[4].as_deref().map(Some)
    };
    if let (
        Some(conn),
        Some(client),
        Some(broker),
        Some(broker_id),
        Some(listener),
        Some(tap),
        Some(capture),
    ) = (
        texts[0].as_deref(),
        texts[1].as_deref(),
        texts[2].as_deref(),
        broker_id,
        listener,
        texts[5].as_deref(),
        texts[6].as_deref(),
    ) {
        let connection = msgpack::Static {
            conn,
            client,
            broker,
            broker_id,
            listener,
            tap,
            capture,
        };
        return Ok(PyBytes::new(py, &msgpack::pack_static(&connection)));
    }
    // Fields of other types (the reference packs whatever it is given): the general writer.
    let mut out = Vec::new();
    msgpack::write_array_header(&mut out, STATIC_FIELDS.len());
    for field in &fields {
        pack_obj(&mut out, field, 1)?;
    }
    Ok(PyBytes::new(py, &out))
}

struct PartFields<'py> {
    direction: Bound<'py, PyAny>,
    ts_ns: Bound<'py, PyAny>,
    api_key: Bound<'py, PyAny>,
    api_version: Bound<'py, PyAny>,
    correlation_id: Bound<'py, PyAny>,
    redacted: String,
    flags: Bound<'py, PyDict>,
    value: Bound<'py, PyAny>,
}

/// What `_part_meta` reads of a part: its attributes, the redacted names joined and `dict(flags)`.
fn part_fields<'py>(part: &Bound<'py, PyAny>) -> PyResult<PartFields<'py>> {
    let py = part.py();
    let mut redacted = String::new();
    for (i, name) in part.getattr(intern!(py, "redacted"))?.try_iter()?.enumerate() {
        if i > 0 {
            redacted.push(',');
        }
        redacted.push_str(&name?.cast_into::<PyString>()?.to_cow()?);
    }
    let flags = part.getattr(intern!(py, "flags"))?;
    let flags = match flags.cast::<PyDict>() {
        Ok(d) => d.clone(),
        Err(_) => py.get_type::<PyDict>().call1((flags,))?.cast_into::<PyDict>()?,
    };
    Ok(PartFields {
        direction: part.getattr(intern!(py, "direction"))?,
        ts_ns: part.getattr(intern!(py, "ts_ns"))?,
        api_key: part.getattr(intern!(py, "api_key"))?,
        api_version: part.getattr(intern!(py, "api_version"))?,
        correlation_id: part.getattr(intern!(py, "correlation_id"))?,
        redacted,
        flags,
        value: part.getattr(intern!(py, "value"))?,
    })
}

/// `p.value or b""`.
fn payload(value: &Bound<'_, PyAny>) -> PyResult<Vec<u8>> {
    if value.is_none() || !value.is_truthy()? {
        return Ok(Vec::new());
    }
    with_bytes(value, <[u8]>::to_vec)
}

/// A part whose fields have the types the native core holds (strings, ints that fit an i64 or None,
/// string flags, bytes or None): borrowed from the Python objects, nothing copied.
struct TypedPart<'py> {
    direction: Bound<'py, PyString>,
    ts_ns: i64,
    api_key: Option<i64>,
    api_version: Option<i64>,
    correlation_id: Option<i64>,
    flags: Vec<(Bound<'py, PyString>, Bound<'py, PyString>)>,
    value: Option<Bound<'py, PyBytes>>,
}

fn typed_part<'py>(fields: &PartFields<'py>) -> PyResult<Option<TypedPart<'py>>> {
    let mut flags = Vec::with_capacity(fields.flags.len());
    for (k, v) in fields.flags.iter() {
        match (k.cast_into::<PyString>(), v.cast_into::<PyString>()) {
            (Ok(k), Ok(v)) => flags.push((k, v)),
            _ => return Ok(None),
        }
    }
    let value = if fields.value.is_none() || !fields.value.is_truthy()? {
        None
    } else {
        match fields.value.cast::<PyBytes>() {
            Ok(b) => Some(b.clone()),
            Err(_) => return Ok(None),
        }
    };
    let (Ok(direction), Some(ts_ns), Some(api_key), Some(api_version), Some(correlation_id)) = (
        fields.direction.cast::<PyString>(),
        plain_int(&fields.ts_ns),
        opt_int(&fields.api_key),
        opt_int(&fields.api_version),
        opt_int(&fields.correlation_id),
    ) else {
        return Ok(None);
    };
    Ok(Some(TypedPart {
        direction: direction.clone(),
        ts_ns,
        api_key,
        api_version,
        correlation_id,
        flags,
        value,
    }))
}

/// The general path: every field through the msgpack writer of Python objects.
fn generic_part(out: &mut Vec<u8>, payloads: &mut Vec<u8>, fields: &PartFields<'_>) -> PyResult<()> {
    msgpack::write_array_header(out, 8);
    for field in [
        &fields.direction,
        &fields.ts_ns,
        &fields.api_key,
        &fields.api_version,
        &fields.correlation_id,
    ] {
        pack_obj(out, field, 2)?;
    }
    msgpack::write_str(out, &fields.redacted);
    if fields.flags.is_empty() {
        msgpack::write_nil(out);
    } else {
        pack_obj(out, fields.flags.as_any(), 3)?;
    }
    let value = payload(&fields.value)?;
    payloads.extend_from_slice(&value);
    msgpack::write_uint(out, value.len() as u64);
    Ok(())
}

type Flush<'py> = Vec<(Bound<'py, PyAny>, Bound<'py, PyAny>, Vec<PartFields<'py>>)>;

/// The record through the native writer (`msgpack::pack_flush`), when every field has the type the
/// native core holds; None otherwise.
fn typed_flush(
    static_: &Bound<'_, PyAny>,
    entries: &Flush<'_>,
    lost: &Bound<'_, PyAny>,
    loss_ns: &Bound<'_, PyAny>,
) -> PyResult<Option<Vec<u8>>> {
    let (Ok(static_), Some(lost), Some(loss_ns)) =
        (static_.cast::<PyBytes>(), plain_int(lost), plain_int(loss_ns))
    else {
        return Ok(None);
    };
    let mut typed: Vec<(Bound<'_, PyString>, i64, Vec<TypedPart<'_>>)> = Vec::with_capacity(entries.len());
    for (kind, seq, parts) in entries {
        let (Ok(kind), Some(seq)) = (kind.cast::<PyString>(), plain_int(seq)) else {
            return Ok(None);
        };
        let mut typed_parts = Vec::with_capacity(parts.len());
        for fields in parts {
            match typed_part(fields)? {
                Some(part) => typed_parts.push(part),
                None => return Ok(None),
            }
        }
        typed.push((kind.clone(), seq, typed_parts));
    }
    // Strings that cannot be UTF-8 (lone surrogates) take the general path, which raises as msgpack does.
    let mut flags: Vec<Vec<Vec<(&str, &str)>>> = Vec::with_capacity(typed.len());
    for (_, _, parts) in &typed {
        let mut per_part = Vec::with_capacity(parts.len());
        for part in parts {
            let mut pairs = Vec::with_capacity(part.flags.len());
            for (k, v) in &part.flags {
                let (Ok(k), Ok(v)) = (k.to_str(), v.to_str()) else {
                    return Ok(None);
                };
                pairs.push((k, v));
            }
            per_part.push(pairs);
        }
        flags.push(per_part);
    }
    let mut parts: Vec<Vec<msgpack::Part<'_>>> = Vec::with_capacity(typed.len());
    for ((_, _, typed_parts), (entry_fields, entry_flags)) in
        typed.iter().zip(entries.iter().map(|e| &e.2).zip(&flags))
    {
        let mut out = Vec::with_capacity(typed_parts.len());
        for ((part, fields), part_flags) in typed_parts.iter().zip(entry_fields).zip(entry_flags) {
            let Ok(direction) = part.direction.to_str() else {
                return Ok(None);
            };
            out.push(msgpack::Part {
                direction,
                ts_ns: part.ts_ns,
                api_key: part.api_key,
                api_version: part.api_version,
                correlation_id: part.correlation_id,
                redacted: &fields.redacted,
                flags: part_flags,
                value: part.value.as_ref().map_or(&[][..], |b| b.as_bytes()),
            });
        }
        parts.push(out);
    }
    let mut kinds = Vec::with_capacity(typed.len());
    for (kind, _, _) in &typed {
        let Ok(kind) = kind.to_str() else {
            return Ok(None);
        };
        kinds.push(kind);
    }
    let entries: Vec<msgpack::Entry<'_>> = typed
        .iter()
        .zip(&kinds)
        .zip(&parts)
        .map(|(((_, seq, _), kind), parts)| msgpack::Entry {
            kind,
            seq: *seq,
            parts,
        })
        .collect();
    Ok(Some(msgpack::pack_flush(
        static_.as_bytes(),
        &entries,
        lost,
        loss_ns,
    )))
}

/// `codec.taprecord.pack_flush`: a schema-3 record value from `static` (``pack_static``), entries
/// `(kind, seq, parts)` of `codec.taprecord.Part`, `lost` and `loss_ns`. Typed fields (the native
/// core's own) go through the native writer; anything else through the general one, as the reference
/// packs it.
#[pyfunction]
#[pyo3(signature = (r#static, entries, lost = None, loss_ns = None))]
fn pack_flush<'py>(
    py: Python<'py>,
    r#static: &Bound<'py, PyAny>,
    entries: &Bound<'py, PyAny>,
    lost: Option<&Bound<'py, PyAny>>,
    loss_ns: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyBytes>> {
    let zero = 0i64.into_pyobject(py)?.into_any();
    let lost = lost.unwrap_or(&zero);
    let loss_ns = loss_ns.unwrap_or(&zero);
    // `if lost or loss_ns: meta.append(lost)`, `if loss_ns: meta.append(loss_ns)`.
    let tail = if loss_ns.is_truthy()? {
        2
    } else {
        usize::from(lost.is_truthy()?)
    };
    let mut flush: Flush<'py> = Vec::new();
    for entry in entries.try_iter()? {
        let (kind, seq, parts): (Bound<'py, PyAny>, Bound<'py, PyAny>, Bound<'py, PyAny>) =
            entry?.extract()?;
        let parts = parts
            .try_iter()?
            .map(|p| part_fields(&p?))
            .collect::<PyResult<Vec<_>>>()?;
        flush.push((kind, seq, parts));
    }
    if let Some(value) = typed_flush(r#static, &flush, lost, loss_ns)? {
        return Ok(PyBytes::new(py, &value));
    }
    let mut meta = Vec::with_capacity(256);
    let mut payloads = Vec::new();
    msgpack::write_array_header(&mut meta, 2 + tail);
    pack_obj(&mut meta, r#static, 1)?;
    msgpack::write_array_header(&mut meta, flush.len());
    for (kind, seq, parts) in &flush {
        msgpack::write_array_header(&mut meta, 3);
        pack_obj(&mut meta, kind, 3)?;
        pack_obj(&mut meta, seq, 3)?;
        msgpack::write_array_header(&mut meta, parts.len());
        for fields in parts {
            generic_part(&mut meta, &mut payloads, fields)?;
        }
    }
    if tail > 0 {
        pack_obj(&mut meta, lost, 1)?;
    }
    if tail > 1 {
        pack_obj(&mut meta, loss_ns, 1)?;
    }
    let mut value = Vec::with_capacity(8 + meta.len() + payloads.len());
    value.extend_from_slice(&msgpack::prefix_3(meta.len()));
    value.extend_from_slice(&meta);
    value.extend_from_slice(&payloads);
    Ok(PyBytes::new(py, &value))
}

#[pymodule]
fn kpmon_tapcore(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    // The digest of the sources this build was made from (set by deploy/tapcore.py), so the adapter
    // can refuse a build older than the source tree it runs beside.
    m.add("SOURCE_DIGEST", option_env!("KPMON_TAPCORE_DIGEST").unwrap_or(""))?;
    m.add("FrameError", m.py().get_type::<FrameError>())?;
    m.add("DecodeError", m.py().get_type::<DecodeError>())?;
    m.add_function(wrap_pyfunction!(use_errors, m)?)?;
    m.add_class::<PyFrameSplitter>()?;
    m.add_function(wrap_pyfunction!(starts_with_tls, m)?)?;
    m.add_function(wrap_pyfunction!(peek_request_header, m)?)?;
    m.add_function(wrap_pyfunction!(peek_correlation_id, m)?)?;
    m.add_class::<PyProduceTable>()?;
    m.add_class::<PyHeldBudget>()?;
    m.add_class::<PyCorrelations>()?;
    m.add_function(wrap_pyfunction!(packb, m)?)?;
    m.add_function(wrap_pyfunction!(pack_static, m)?)?;
    m.add_function(wrap_pyfunction!(pack_flush, m)?)?;
    crate::connection_binding::register(m)?;
    Ok(())
}
