//! `kpmon_tapcore`: the tap's per-frame building blocks, native, each the twin of a Python reference
//! (`tap.framing`, `codec.peek`, `codec.taprecord`) and held byte-identical to it by
//! tests/tap/test_native_core.py. The modules are sans-I/O and know nothing of Python, so a
//! per-connection core can compose them without a Python object per frame; `binding` (the default
//! `python` feature) exposes them one by one. `cargo test --no-default-features` tests them alone.

pub mod connection;
pub mod correlations;
pub mod framing;
pub mod msgpack;
pub mod peek;
pub mod strip;

#[cfg(feature = "python")]
mod binding;
#[cfg(feature = "python")]
mod connection_binding;
