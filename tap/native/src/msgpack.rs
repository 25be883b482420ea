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
