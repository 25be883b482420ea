//! Header peeks (`codec.peek`) and `tap.framing.expects_response`, over tables Python builds from
//! the codec's schema table (no protocol knowledge is written here by hand beyond the fixed
//! request-header prefix every version shares).

use std::collections::HashMap;

/// Where a peek failed, as `codec.errors.DecodeError` takes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeekError {
    pub reason: String,
    pub offset: i64,
    pub api_key: Option<i16>,
    pub api_version: Option<i16>,
    pub what: &'static str,
}

/// `codec.peek.RequestHeaderPeek`, with the client id's bytes undecoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestHeader<'a> {
    pub api_key: i16,
    pub api_version: i16,
    pub correlation_id: i32,
    pub client_id: Option<&'a [u8]>,
    pub end: usize,
}

fn i16_at(buf: &[u8], pos: usize) -> i16 {
    i16::from_be_bytes([buf[pos], buf[pos + 1]])
}

fn i32_at(buf: &[u8], pos: usize) -> i32 {
    i32::from_be_bytes([buf[pos], buf[pos + 1], buf[pos + 2], buf[pos + 3]])
}

pub fn peek_request_header(buf: &[u8]) -> Result<RequestHeader<'_>, PeekError> {
    if buf.len() < 8 {
        return Err(PeekError {
            reason: format!("request header needs 8 bytes, frame has {}", buf.len()),
            offset: 0,
            api_key: None,
            api_version: None,
            what: "RequestHeader",
        });
    }
    let api_key = i16_at(buf, 0);
    let api_version = i16_at(buf, 2);
    let correlation_id = i32_at(buf, 4);
    if buf.len() < 10 {
        return Ok(RequestHeader {
            api_key,
            api_version,
            correlation_id,
            client_id: None,
            end: 8,
        });
    }
    let n = i16_at(buf, 8);
    if n < 0 {
        return Ok(RequestHeader {
            api_key,
            api_version,
            correlation_id,
            client_id: None,
            end: 10,
        });
    }
    let end = 10 + n as usize;
    if end > buf.len() {
        return Err(PeekError {
            reason: format!("client id length {} exceeds the {} bytes left", n, buf.len() - 10),
            offset: 8,
            api_key: Some(api_key),
            api_version: Some(api_version),
            what: "RequestHeader",
        });
    }
    Ok(RequestHeader {
        api_key,
        api_version,
        correlation_id,
        client_id: Some(&buf[10..end]),
        end,
    })
}

pub fn peek_correlation_id(buf: &[u8]) -> Result<i32, PeekError> {
    if buf.len() < 4 {
        return Err(PeekError {
            reason: format!("response header needs 4 bytes, frame has {}", buf.len()),
            offset: 0,
            api_key: None,
            api_version: None,
            what: "ResponseHeader",
        });
    }
    Ok(i32_at(buf, 0))
}

/// Per Produce version, from the schema table: the request header version, and whether strings are
/// compact and how many precede `Acks` (None: the peek cannot skip what precedes it).
#[derive(Debug, Clone, Default)]
pub struct ProduceTable {
    pub header_versions: HashMap<i64, i64>,
    pub acks_layouts: HashMap<i64, Option<(bool, u32)>>,
}

impl ProduceTable {
    /// `codec.peek.peek_produce_acks`: a Produce request's `Acks` read at `body`, or None when the
    /// bytes do not say.
    pub fn peek_produce_acks(&self, buf: &[u8], api_version: i64, body: i64) -> Option<i16> {
        let (compact, strings) = (*self.acks_layouts.get(&api_version)?)?;
        let len = buf.len() as i64;
        let mut pos = body;
        for _ in 0..strings {
            if compact {
                let mut length: i64 = 0;
                let mut shift = 0u32;
                loop {
                    if pos >= len || shift > 28 {
                        return None;
                    }
                    // A negative position reads from the end, as Python's indexing does.
                    let byte = buf[index(pos, len)?];
                    pos += 1;
                    length |= i64::from(byte & 0x7F) << shift;
                    if byte & 0x80 == 0 {
                        break;
                    }
                    shift += 7;
                }
                pos = pos.saturating_add((length - 1).max(0));
            } else {
                if pos.saturating_add(2) > len {
                    return None;
                }
                let at = index(pos, len)?;
                if at + 2 > buf.len() {
                    return None;
                }
                pos = pos.saturating_add(2 + i64::from(i16_at(buf, at)).max(0));
            }
        }
        if pos.saturating_add(2) > len {
            return None;
        }
        let at = index(pos, len)?;
        if at + 2 > buf.len() {
            return None;
        }
        Some(i16_at(buf, at))
    }

    /// `tap.framing.expects_response`: every request but a Produce with acks=0 is answered.
    pub fn expects_response(&self, head: &[u8], api_key: i64, api_version: i64) -> bool {
        if api_key != PRODUCE {
            return true;
        }
        let Some(&header_version) = self.header_versions.get(&api_version) else {
            return true;
        };
        let Some(body) = request_header_end(head, header_version) else {
            return true;
        };
        self.peek_produce_acks(head, api_version, body as i64) != Some(0)
    }
}

pub const PRODUCE: i64 = 0;

fn index(pos: i64, len: i64) -> Option<usize> {
    if pos >= 0 {
        Some(pos as usize)
    } else if pos + len >= 0 {
        Some((pos + len) as usize)
    } else {
        None
    }
}

/// `codec.wire.read_uvarint`: at most 5 bytes.
pub fn read_uvarint(buf: &[u8], mut pos: usize) -> Option<(u64, usize)> {
    let mut result: u64 = 0;
    let mut shift = 0u32;
    loop {
        let byte = *buf.get(pos)?;
        pos += 1;
        result |= u64::from(byte & 0x7F) << shift;
        if byte < 0x80 {
            return Some((result, pos));
        }
        shift += 7;
        if shift > 28 {
            return None;
        }
    }
}

/// Where the body starts after a request header of `header_version` (the codec's decoder of
/// `RequestHeader`: a nullable int16-length UTF-8 client id from v1, a tagged-field section from v2),
/// or None where that decoder raises.
pub fn request_header_end(buf: &[u8], header_version: i64) -> Option<usize> {
    if buf.len() < 4 {
        return None;
    }
    if header_version <= 0 {
        return if buf.len() >= 8 { Some(8) } else { None };
    }
    if buf.len() < 10 {
        return None;
    }
    let n = i16_at(buf, 8);
    let mut pos = 10usize;
    if n >= 0 {
        let end = pos + n as usize;
        if end > buf.len() || std::str::from_utf8(&buf[pos..end]).is_err() {
            return None;
        }
        pos = end;
    }
    if header_version >= 2 {
        let limit = buf.len() as u64;
        let (count, mut p) = read_uvarint(buf, pos)?;
        if count * 2 > limit - p as u64 {
            return None;
        }
        for _ in 0..count {
            let (_, after_tag) = read_uvarint(buf, p)?;
            let (size, after_size) = read_uvarint(buf, after_tag)?;
            let end = after_size as u64 + size;
            if end > limit {
                return None;
            }
            p = end as usize;
        }
        pos = p;
    }
    Some(pos)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn produce(version: i16, client_id: &[u8], tags: &[u8], acks: i16) -> Vec<u8> {
        let mut frame = Vec::new();
        frame.extend_from_slice(&0i16.to_be_bytes());
        frame.extend_from_slice(&version.to_be_bytes());
        frame.extend_from_slice(&7i32.to_be_bytes());
        frame.extend_from_slice(&(client_id.len() as i16).to_be_bytes());
        frame.extend_from_slice(client_id);
        frame.extend_from_slice(tags);
        // A null transactional id: int16 -1 (v3-v8), compact 0 (v9+).
        if version >= 9 {
            frame.push(0);
        } else {
            frame.extend_from_slice(&(-1i16).to_be_bytes());
        }
        frame.extend_from_slice(&acks.to_be_bytes());
        frame
    }

    fn table() -> ProduceTable {
        ProduceTable {
            header_versions: HashMap::from([(3, 1), (9, 2)]),
            acks_layouts: HashMap::from([(3, Some((false, 1))), (9, Some((true, 1)))]),
        }
    }

    #[test]
    fn only_a_produce_with_acks_0_goes_unanswered() {
        let t = table();
        assert!(!t.expects_response(&produce(3, b"app", b"", 0), 0, 3));
        assert!(t.expects_response(&produce(3, b"app", b"", -1), 0, 3));
        assert!(!t.expects_response(&produce(9, b"app", b"\x01\x05\x01x", 0), 0, 9));
        // A client id that is not UTF-8: the codec cannot read the header, so a response is assumed.
        assert!(t.expects_response(&produce(3, b"\xff", b"", 0), 0, 3));
        // An unknown version, or another API.
        assert!(t.expects_response(&produce(3, b"app", b"", 0), 0, 4));
        assert!(t.expects_response(&produce(3, b"app", b"", 0), 1, 3));
    }

    #[test]
    fn headers_peek_as_the_codec_does() {
        let frame = produce(3, b"app", b"", 1);
        let header = peek_request_header(&frame).expect("a header");
        assert_eq!(
            (header.api_key, header.api_version, header.correlation_id),
            (0, 3, 7)
        );
        assert_eq!((header.client_id, header.end), (Some(&b"app"[..]), 13));
        let err = peek_request_header(&frame[..5]).unwrap_err();
        assert_eq!(err.reason, "request header needs 8 bytes, frame has 5");
        let err = peek_request_header(&frame[..11]).unwrap_err();
        assert_eq!(
            (err.reason.as_str(), err.offset),
            ("client id length 3 exceeds the 1 bytes left", 8)
        );
        assert_eq!(peek_correlation_id(&[0, 0, 1, 0]), Ok(256));
    }
}
