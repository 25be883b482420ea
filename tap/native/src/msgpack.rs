//! A msgpack writer byte-identical to Python's `msgpack.packb(value, use_bin_type=True)` for the
//! types tap records use, and the schema-3 record value (`codec.taprecord.pack_flush`).
//!
//! msgpack-python always picks the smallest encoding: positive ints as fixint, then uint8..uint64
//! (never a signed type), negative ints as negative fixint, then int8..int64; `str` as fixstr, str8,
//! str16, str32; `bytes` as bin8, bin16, bin32; containers with fix, 16- and 32-bit headers.

pub fn write_nil(out: &mut Vec<u8>) {
    out.push(0xc0);
}

pub fn write_bool(out: &mut Vec<u8>, value: bool) {
    out.push(if value { 0xc3 } else { 0xc2 });
}

pub fn write_int(out: &mut Vec<u8>, value: i64) {
    if value < -(1 << 5) {
        if value < -(1 << 15) {
            if value < -(1i64 << 31) {
                out.push(0xd3);
                out.extend_from_slice(&value.to_be_bytes());
            } else {
                out.push(0xd2);
                out.extend_from_slice(&(value as i32).to_be_bytes());
            }
        } else if value < -(1 << 7) {
            out.push(0xd1);
            out.extend_from_slice(&(value as i16).to_be_bytes());
        } else {
            out.push(0xd0);
            out.push(value as i8 as u8);
        }
    } else if value < (1 << 7) {
        out.push(value as i8 as u8);
    } else {
        write_uint(out, value as u64);
    }
}

pub fn write_uint(out: &mut Vec<u8>, value: u64) {
    if value < (1 << 7) {
        out.push(value as u8);
    } else if value < (1 << 8) {
        out.push(0xcc);
        out.push(value as u8);
    } else if value < (1 << 16) {
        out.push(0xcd);
        out.extend_from_slice(&(value as u16).to_be_bytes());
    } else if value < (1 << 32) {
        out.push(0xce);
        out.extend_from_slice(&(value as u32).to_be_bytes());
    } else {
        out.push(0xcf);
        out.extend_from_slice(&value.to_be_bytes());
    }
}

pub fn write_float(out: &mut Vec<u8>, value: f64) {
    out.push(0xcb);
    out.extend_from_slice(&value.to_be_bytes());
}

fn write_len(out: &mut Vec<u8>, n: usize, fix: Option<(u8, usize)>, small: Option<u8>, mid: u8, big: u8) {
    match fix {
        Some((tag, limit)) if n < limit => out.push(tag | n as u8),
        _ => match small {
            Some(tag) if n < (1 << 8) => {
                out.push(tag);
                out.push(n as u8);
            }
            _ if n < (1 << 16) => {
                out.push(mid);
                out.extend_from_slice(&(n as u16).to_be_bytes());
            }
            _ => {
                out.push(big);
                out.extend_from_slice(&(n as u32).to_be_bytes());
            }
        },
    }
}

pub fn write_str(out: &mut Vec<u8>, value: &str) {
    write_len(out, value.len(), Some((0xa0, 32)), Some(0xd9), 0xda, 0xdb);
    out.extend_from_slice(value.as_bytes());
}

pub fn write_bin(out: &mut Vec<u8>, value: &[u8]) {
    write_len(out, value.len(), None, Some(0xc4), 0xc5, 0xc6);
    out.extend_from_slice(value);
}

pub fn write_array_header(out: &mut Vec<u8>, n: usize) {
    write_len(out, n, Some((0x90, 16)), None, 0xdc, 0xdd);
}

pub fn write_map_header(out: &mut Vec<u8>, n: usize) {
    write_len(out, n, Some((0x80, 16)), None, 0xde, 0xdf);
}

/// The first bytes of every schema-3 value (`codec.taprecord.MAGIC_3`).
pub const MAGIC_3: &[u8; 4] = b"\xffKT\x03";

/// The prefix of a schema-3 value for metadata already packed: `MAGIC_3 | len (u32 BE)`.
pub fn prefix_3(meta_len: usize) -> [u8; 8] {
    let mut prefix = [0u8; 8];
    prefix[..4].copy_from_slice(MAGIC_3);
    prefix[4..].copy_from_slice(&(meta_len as u32).to_be_bytes());
    prefix
}

/// One part of a tap record as the native core holds it: `codec.taprecord.Part`, with its redacted
/// names already joined (`,`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Part<'a> {
    pub direction: &'a str,
    pub ts_ns: i64,
    pub api_key: Option<i64>,
    pub api_version: Option<i64>,
    pub correlation_id: Option<i64>,
    pub redacted: &'a str,
    pub flags: &'a [(&'a str, &'a str)],
    pub value: &'a [u8],
}

/// One entry of a schema-3 record: an exchange, a lone frame or a lifecycle event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry<'a> {
    pub kind: &'a str,
    pub seq: i64,
    pub parts: &'a [Part<'a>],
}

fn write_opt_int(out: &mut Vec<u8>, value: Option<i64>) {
    match value {
        Some(v) => write_int(out, v),
        None => write_nil(out),
    }
}

/// `[dir, ts_ns, api_key, api_version, corr_id, redacted, flags, length]` (`taprecord._part_meta`).
fn write_part_meta(out: &mut Vec<u8>, part: &Part<'_>) {
    write_array_header(out, 8);
    write_str(out, part.direction);
    write_int(out, part.ts_ns);
    write_opt_int(out, part.api_key);
    write_opt_int(out, part.api_version);
    write_opt_int(out, part.correlation_id);
    write_str(out, part.redacted);
    if part.flags.is_empty() {
        write_nil(out);
    } else {
        write_map_header(out, part.flags.len());
        for (name, value) in part.flags {
            write_str(out, name);
            write_str(out, value);
        }
    }
    write_uint(out, part.value.len() as u64);
}

/// A schema-3 record value (`codec.taprecord.pack_flush`): `MAGIC_3 | meta length | meta | payloads`,
/// meta being `[static, [[kind, seq, [part meta...]]...], lost, loss_ns]`, `loss_ns` left out while 0
/// and `lost` too unless `loss_ns` is written.
pub fn pack_flush(static_: &[u8], entries: &[Entry<'_>], lost: i64, loss_ns: i64) -> Vec<u8> {
    let mut meta = Vec::with_capacity(64 + static_.len() + 48 * entries.len());
    let tail = if loss_ns != 0 { 2 } else { usize::from(lost != 0) };
    write_array_header(&mut meta, 2 + tail);
    write_bin(&mut meta, static_);
    write_array_header(&mut meta, entries.len());
    let mut payload_len = 0;
    for entry in entries {
        write_array_header(&mut meta, 3);
        write_str(&mut meta, entry.kind);
        write_int(&mut meta, entry.seq);
        write_array_header(&mut meta, entry.parts.len());
        for part in entry.parts {
            write_part_meta(&mut meta, part);
            payload_len += part.value.len();
        }
    }
    if tail > 0 {
        write_int(&mut meta, lost);
    }
    if tail > 1 {
        write_int(&mut meta, loss_ns);
    }
    let mut value = Vec::with_capacity(8 + meta.len() + payload_len);
    value.extend_from_slice(&prefix_3(meta.len()));
    value.extend_from_slice(&meta);
    for entry in entries {
        for part in entry.parts {
            value.extend_from_slice(part.value);
        }
    }
    value
}

/// `codec.taprecord.pack_static` of a connection's fields (`STATIC_FIELDS` order).
pub struct Static<'a> {
    pub conn: &'a str,
    pub client: &'a str,
    pub broker: &'a str,
    pub broker_id: Option<i64>,
    pub listener: Option<&'a str>,
    pub tap: &'a str,
    pub capture: &'a str,
}

pub fn pack_static(connection: &Static<'_>) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    write_array_header(&mut out, 7);
    write_str(&mut out, connection.conn);
    write_str(&mut out, connection.client);
    write_str(&mut out, connection.broker);
    write_opt_int(&mut out, connection.broker_id);
    match connection.listener {
        Some(listener) => write_str(&mut out, listener),
        None => write_nil(&mut out),
    }
    write_str(&mut out, connection.tap);
    write_str(&mut out, connection.capture);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn int(value: i64) -> Vec<u8> {
        let mut out = Vec::new();
        write_int(&mut out, value);
        out
    }

    #[test]
    fn ints_take_msgpack_python_s_smallest_form() {
        assert_eq!(int(127), [0x7f]);
        assert_eq!(int(128), [0xcc, 0x80]);
        assert_eq!(int(256), [0xcd, 0x01, 0x00]);
        assert_eq!(int(65_536), [0xce, 0, 1, 0, 0]);
        assert_eq!(int(1 << 32), [0xcf, 0, 0, 0, 1, 0, 0, 0, 0]);
        assert_eq!(int(-32), [0xe0]);
        assert_eq!(int(-33), [0xd0, 0xdf]);
        assert_eq!(int(-129), [0xd1, 0xff, 0x7f]);
        assert_eq!(int(-32_769), [0xd2, 0xff, 0xff, 0x7f, 0xff]);
        assert_eq!(int(i64::MIN)[0], 0xd3);
    }

    #[test]
    fn a_flush_is_its_prefix_meta_and_payloads() {
        let part = Part {
            direction: "req",
            ts_ns: 5,
            api_key: Some(18),
            api_version: None,
            correlation_id: Some(1),
            redacted: "",
            flags: &[("truncated", "1")],
            value: b"xy",
        };
        let parts = [part];
        let entries = [Entry {
            kind: "ex",
            seq: 1,
            parts: &parts,
        }];
        let value = pack_flush(b"s", &entries, 0, 0);
        let meta: &[u8] = &[
            0x92, 0xc4, 0x01, b's', 0x91, 0x93, 0xa2, b'e', b'x', 0x01, 0x91, 0x98, 0xa3, b'r', b'e', b'q',
            0x05, 0x12, 0xc0, 0x01, 0xa0, 0x81, 0xa9, b't', b'r', b'u', b'n', b'c', b'a', b't', b'e', b'd',
            0xa1, b'1', 0x02,
        ];
        assert_eq!(&value[..4], MAGIC_3);
        assert_eq!(&value[4..8], &(meta.len() as u32).to_be_bytes());
        assert_eq!(&value[8..8 + meta.len()], meta);
        assert_eq!(&value[8 + meta.len()..], b"xy");
        // `lost` is written before a `loss_ns`, even while 0; each changes only the list's end.
        let with_loss = pack_flush(b"s", &entries, 0, 300);
        assert_eq!(with_loss[8], 0x94);
        assert_eq!(&with_loss[9..8 + meta.len()], &meta[1..]);
        assert_eq!(
            &with_loss[8 + meta.len()..8 + meta.len() + 4],
            &[0x00, 0xcd, 0x01, 0x2c]
        );
    }
}
