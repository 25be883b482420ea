//! The `headers` capture of a record-carrying frame (`tap.strip.strip_frame`), walked natively from
//! the plans `tap/strip.py` compiles from the codec's schema and hands over as plain tuples. Nothing
//! here knows an API: a plan says what to skip. Where the Python walk would raise, or a records
//! section holds anything but magic-2 batches, the native walk returns None and the frame goes to
//! Python, which then falls back to the codec exactly as today.

use crate::peek::read_uvarint;

/// One step of a plan (`tap.strip` `_FIXED`, `_SIZED`, `_RECORDS`, `_ARRAY`, `_STRUCT`, `_TAGS`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    Fixed(usize),
    Sized { flexible: bool, width: u8 },
    Records { flexible: bool },
    Array { flexible: bool, plan: Vec<Step> },
    Struct(Vec<Step>),
    Tags,
}

/// `codec.records`: a v2 batch header, the length prefix and offset before `batchLength`'s data.
pub const HEADER_SIZE: usize = 61;
pub const LOG_OVERHEAD: usize = 12;
pub const STRIPPED_LENGTH: i32 = (HEADER_SIZE - LOG_OVERHEAD) as i32;

/// (start of the length field, start of the data, end of the data, flexible)
type Span = (usize, usize, usize, bool);

fn i16_at(buf: &[u8], pos: usize) -> Option<i16> {
    let b = buf.get(pos..pos.checked_add(2)?)?;
    Some(i16::from_be_bytes([b[0], b[1]]))
}

fn i32_at(buf: &[u8], pos: usize) -> Option<i32> {
    let b = buf.get(pos..pos.checked_add(4)?)?;
    Some(i32::from_be_bytes([b[0], b[1], b[2], b[3]]))
}

fn walk(buf: &[u8], mut pos: usize, steps: &[Step], spans: &mut Vec<Span>) -> Option<usize> {
    let len = buf.len();
    for step in steps {
        match step {
            Step::Fixed(n) => pos = pos.checked_add(*n)?,
            Step::Sized { flexible, width } => {
                let size: i64;
                if *flexible {
                    let (v, p) = read_uvarint(buf, pos)?;
                    size = v as i64 - 1;
                    pos = p;
                } else if *width == 2 {
                    size = i64::from(i16_at(buf, pos)?);
                    pos += 2;
                } else {
                    size = i64::from(i32_at(buf, pos)?);
                    pos += 4;
                }
                if size > 0 {
                    pos = pos.checked_add(size as usize)?;
                }
            }
            Step::Records { flexible } => {
                let at = pos;
                let size: i64;
                if *flexible {
                    let (v, p) = read_uvarint(buf, pos)?;
                    size = v as i64 - 1;
                    pos = p;
                } else {
                    size = i64::from(i32_at(buf, pos)?);
                    pos += 4;
                }
                if size > 0 {
                    let end = pos.checked_add(size as usize)?;
                    if end > len {
                        return None;
                    }
                    spans.push((at, pos, end, *flexible));
                    pos = end;
                }
            }
            Step::Array { flexible, plan } => {
                let count: i64;
                if *flexible {
                    let (v, p) = read_uvarint(buf, pos)?;
                    count = v as i64 - 1;
                    pos = p;
                } else {
                    count = i64::from(i32_at(buf, pos)?);
                    pos += 4;
                }
                for _ in 0..count.max(0) {
                    pos = walk(buf, pos, plan, spans)?;
                }
            }
            Step::Struct(plan) => {
                let present = *buf.get(pos)? != 0xFF;
                pos += 1;
                if present {
                    pos = walk(buf, pos, plan, spans)?;
                }
            }
            Step::Tags => {
                let (count, p) = read_uvarint(buf, pos)?;
                pos = p;
                for _ in 0..count {
                    let (_, p) = read_uvarint(buf, pos)?;
                    let (size, p) = read_uvarint(buf, p)?;
                    pos = p.checked_add(size as usize)?;
                }
            }
        }
        if pos > len {
            return None;
        }
    }
    Some(pos)
}

/// `tap.strip.strip_v2_section` appended to `out`: false for anything but magic-2 batches.
fn strip_v2_section(buf: &[u8], start: usize, end: usize, out: &mut Vec<u8>) -> bool {
    let mut p = start;
    while end - p >= LOG_OVERHEAD {
        let length = i32_at(buf, p + 8).expect("inside the section");
        let q = (p + LOG_OVERHEAD) as i64 + i64::from(length);
        if q > end as i64 {
            break;
        }
        if length < STRIPPED_LENGTH || buf[p + 16] != 2 {
            return false;
        }
        push_stripped(buf, p, out);
        p = q as usize;
    }
    if end - p >= 17 {
        if buf[p + 16] != 2 {
            return false;
        }
        if end - p >= HEADER_SIZE {
            push_stripped(buf, p, out);
        }
    }
    true
}

fn push_stripped(buf: &[u8], p: usize, out: &mut Vec<u8>) {
    out.extend_from_slice(&buf[p..p + 8]);
    out.extend_from_slice(&STRIPPED_LENGTH.to_be_bytes());
    out.extend_from_slice(&buf[p + LOG_OVERHEAD..p + HEADER_SIZE]);
}

fn write_uvarint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8 & 0x7F) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

/// `tap.strip.strip_frame` with the batches stripped in place: the frame (its body at `body`) with
/// every records field's payloads dropped, or None where Python must decide (the walk does not end
/// at the frame's end, or a section is not all magic-2 batches).
pub fn strip_frame(frame: &[u8], body: usize, plan: &[Step]) -> Option<Vec<u8>> {
    let mut spans = Vec::new();
    let end = walk(frame, body, plan, &mut spans)?;
    if end != frame.len() {
        return None;
    }
    let mut out = Vec::with_capacity(frame.len().min(4096));
    let mut section = Vec::new();
    let mut prev = 0;
    for (at, start, stop, flexible) in spans {
        out.extend_from_slice(&frame[prev..at]);
        section.clear();
        if !strip_v2_section(frame, start, stop, &mut section) {
            return None;
        }
        if flexible {
            write_uvarint(&mut out, section.len() as u64 + 1);
        } else {
            out.extend_from_slice(&(section.len() as i32).to_be_bytes());
        }
        out.extend_from_slice(&section);
        prev = stop;
    }
    out.extend_from_slice(&frame[prev..]);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(payload: usize) -> Vec<u8> {
        let mut b = vec![0u8; HEADER_SIZE + payload];
        b[8..12].copy_from_slice(&((HEADER_SIZE - LOG_OVERHEAD + payload) as i32).to_be_bytes());
        b[16] = 2;
        b
    }

    #[test]
    fn records_are_stripped_to_their_batch_headers() {
        // An int16 field, then a non-flexible records field holding two batches.
        let plan = [Step::Fixed(2), Step::Records { flexible: false }];
        let mut records = batch(10);
        records.extend(batch(3));
        let mut frame = vec![0, 7];
        frame.extend_from_slice(&(records.len() as i32).to_be_bytes());
        frame.extend_from_slice(&records);
        let out = strip_frame(&frame, 0, &plan).expect("walks");
        assert_eq!(&out[..2], &[0, 7]);
        assert_eq!(&out[2..6], &(2 * HEADER_SIZE as i32).to_be_bytes());
        assert_eq!(out.len(), 6 + 2 * HEADER_SIZE);
        // A legacy batch, or a frame that does not walk to its end, goes to Python.
        let mut legacy = frame.clone();
        legacy[6 + 16] = 1;
        assert!(strip_frame(&legacy, 0, &plan).is_none());
        frame.push(0);
        assert!(strip_frame(&frame, 0, &plan).is_none());
    }
}
