//! Incremental Kafka framing: the native twin of `tap.framing.FrameSplitter`.
//!
//! The splitter only watches the stream go by: it finds the 4-byte size prefixes, keeps at most
//! `retain` bytes of each frame (of a larger one, its first `min(retain, head)` bytes) and hands a
//! frame over once its last byte has passed. Everything it keeps is copied, so a caller may reuse
//! its buffer.

/// A frame as it passed on the wire: its announced size and the bytes kept of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WireFrame {
    pub size: i32,
    pub head: Vec<u8>,
}

/// The stream is not Kafka framing: a negative size, or one above `max_frame`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrameError {
    pub size: i32,
    pub max: i64,
}

impl std::fmt::Display for FrameError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "frame size {} outside 0..{}", self.size, self.max)
    }
}

pub struct Splitter {
    retain: i64,
    head: i64,
    max: i64,
    prefix: [u8; 4],
    prefix_len: usize,
    /// Size of the frame being read; -1 while reading a prefix.
    size: i64,
    remaining: i64,
    keep: i64,
    parts: Vec<u8>,
}

impl Splitter {
    pub fn new(retain: i64, max_frame: i64, head: i64) -> Self {
        Splitter {
            retain,
            head,
            max: max_frame,
            prefix: [0; 4],
            prefix_len: 0,
            size: -1,
            remaining: 0,
            keep: 0,
            parts: Vec::new(),
        }
    }

    pub fn mid_frame(&self) -> bool {
        self.size >= 0 || self.prefix_len > 0
    }

    pub fn set_retain(&mut self, retain: i64) {
        self.retain = retain;
    }

    /// Calls `emit` with each frame that ended inside `data`, in order. On a bad size, the frames
    /// before it have been emitted and the error is returned.
    pub fn feed<F: FnMut(WireFrame)>(&mut self, data: &[u8], mut emit: F) -> Result<(), FrameError> {
        let end = data.len();
        let mut pos = 0usize;
        while pos < end {
            if self.size < 0 {
                let size: i32;
                if self.prefix_len > 0 || end - pos < 4 {
                    let need = 4 - self.prefix_len;
                    let take = need.min(end - pos);
                    self.prefix[self.prefix_len..self.prefix_len + take]
                        .copy_from_slice(&data[pos..pos + take]);
                    self.prefix_len += take;
                    pos += take;
                    if self.prefix_len < 4 {
                        break;
                    }
                    size = i32::from_be_bytes(self.prefix);
                    self.prefix_len = 0;
                } else {
                    size = i32::from_be_bytes([data[pos], data[pos + 1], data[pos + 2], data[pos + 3]]);
                    pos += 4;
                }
                if size < 0 || i64::from(size) > self.max {
                    return Err(FrameError { size, max: self.max });
                }
                if size == 0 {
                    emit(WireFrame {
                        size: 0,
                        head: Vec::new(),
                    });
                    continue;
                }
                let wide = i64::from(size);
                let keep = if wide <= self.retain {
                    wide
                } else {
                    self.retain.min(self.head)
                };
                // A negative retain or head keeps nothing, as Python's empty slices do.
                let keep = keep.max(0);
                if (end - pos) as i64 >= wide {
                    // The whole frame is in this chunk: one slice.
                    let kept = keep as usize;
                    emit(WireFrame {
                        size,
                        head: data[pos..pos + kept].to_vec(),
                    });
                    pos += size as usize;
                    continue;
                }
                self.size = wide;
                self.remaining = wide;
                self.keep = keep;
            }
            let take = (self.remaining as usize).min(end - pos);
            if self.keep > 0 {
                let kept = (self.keep as usize).min(take);
                self.parts.extend_from_slice(&data[pos..pos + kept]);
                self.keep -= kept as i64;
            }
            pos += take;
            self.remaining -= take as i64;
            if self.remaining == 0 {
                emit(WireFrame {
                    size: self.size as i32,
                    head: std::mem::take(&mut self.parts),
                });
                self.size = -1;
            }
        }
        Ok(())
    }
}

/// Whether a stream's first bytes are a TLS record header rather than a Kafka size prefix
/// (`tap.framing.starts_with_tls`).
pub fn starts_with_tls(data: &[u8]) -> bool {
    data.len() >= 3 && (0x14..=0x17).contains(&data[0]) && data[1] == 0x03 && data[2] <= 0x04
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stream(payloads: &[&[u8]]) -> Vec<u8> {
        payloads
            .iter()
            .flat_map(|p| {
                (p.len() as i32)
                    .to_be_bytes()
                    .into_iter()
                    .chain(p.iter().copied())
            })
            .collect()
    }

    #[test]
    fn every_cut_yields_the_same_frames() {
        let payloads: [&[u8]; 4] = [b"abc", b"", b"0123456789abcdef", b"z"];
        let data = stream(&payloads);
        for cut in 0..=data.len() {
            for second in cut..=data.len() {
                let mut splitter = Splitter::new(8, 1 << 30, 4);
                let mut frames = Vec::new();
                for chunk in [&data[..cut], &data[cut..second], &data[second..]] {
                    splitter.feed(chunk, |f| frames.push(f)).expect("valid framing");
                }
                let sizes: Vec<i32> = frames.iter().map(|f| f.size).collect();
                assert_eq!(sizes, vec![3, 0, 16, 1]);
                let heads: Vec<&[u8]> = frames.iter().map(|f| f.head.as_slice()).collect();
                assert_eq!(heads, vec![&b"abc"[..], b"", b"0123", b"z"]);
                assert!(!splitter.mid_frame());
            }
        }
    }

    #[test]
    fn bad_sizes_are_refused() {
        for size in [-1i32, i32::MIN, (1 << 30) + 1] {
            let err = Splitter::new(10, 1 << 30, 10)
                .feed(&size.to_be_bytes(), |_| {})
                .unwrap_err();
            assert_eq!(
                err.to_string(),
                format!("frame size {size} outside 0..1073741824")
            );
        }
        let mut splitter = Splitter::new(10, 1 << 30, 10);
        splitter
            .feed(b"\x00\x00\x00\x05ab", |_| {})
            .expect("a frame begun");
        assert!(splitter.mid_frame());
    }
}
