//! The per-connection tap core, native: the twin of the Python reference `tap.core.PyTapCore`.
//!
//! Bytes in from either side; frames framed (`framing`), requests paired with responses
//! (`correlations`), each frame captured by the policy, entries gathered into schema-3 records
//! (`msgpack::pack_flush`, `tap.flush.FlushBuffer`'s bounds), counters kept here and read at scrape
//! time. Sans-I/O: the caller passes both clocks with each chunk. Every piece of protocol knowledge
//! comes in `Tables`, built in Python from the codec's schema. A frame the core must not decide
//! alone (a secret to redact, a SASL mechanism to read, a records section it cannot strip) stops the
//! walk: it is handed to Python as a `Slow` frame and the rest of the chunk waits until `resolve`.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;

use crate::correlations::{Budget, Correlations, Limits, Pending, Reason};
use crate::framing::{FrameError, Splitter, WireFrame};
use crate::msgpack;
use crate::peek::{self, ProduceTable};
use crate::strip::{self, Step};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    Full,
    Headers,
    Meta,
}

/// Protocol knowledge, built once per process from the codec's schema.
#[derive(Debug, Clone, Default)]
pub struct Tables {
    /// Request header version per (api key, version); absent: the codec cannot read the header.
    pub request_headers: HashMap<(i64, i64), i64>,
    /// Response header version per (api key, version); absent: 0 (`tap.capture.header_end`).
    pub response_headers: HashMap<(i64, i64), i64>,
    pub produce: ProduceTable,
    /// api key -> (first version, offset of the error code after the response header).
    pub error_offsets: HashMap<i64, (i64, usize)>,
    /// Strip plans per (api key, request?, version), where the `headers` policy strips records.
    pub strip_plans: HashMap<(i64, bool, i64), Vec<Step>>,
    /// (api key, request?) whose records the `headers` policy strips.
    pub records: HashSet<(i64, bool)>,
    /// (api key, request?) -> the inclusive version range of frames that go to Python.
    pub slow: HashMap<(i64, bool), (i64, i64)>,
    /// Raw tokens per SASL mechanism (upper case) after a SaslHandshake v0 (`tap.framing.SASL_ROUNDS`).
    pub sasl_rounds: HashMap<String, i64>,
    /// ...and for any other mechanism (`tap.framing.FOREVER`: raw for the rest of the connection).
    pub sasl_other_rounds: i64,
    /// Latency bucket bounds, ns, ascending.
    pub latency_buckets_ns: Vec<i64>,
    pub rebalance_waits: Vec<i64>,
}

#[derive(Debug, Clone)]
pub struct Settings {
    pub policy: Policy,
    pub mirror: bool,
    pub max_mirrored: i64,
    pub max_frame: i64,
    /// Bytes the splitter keeps of a frame (`CoreSettings.retain`), and of a larger one at most
    /// `head_bytes` (`tap.framing.HEAD_BYTES`).
    pub retain: i64,
    pub head_bytes: i64,
    pub hold: Limits,
    pub flush_max_bytes: i64,
    pub flush_max_entries: usize,
    pub flush_max_age_ns: i64,
}

impl Tables {
    fn is_slow(&self, api_key: i64, request: bool, api_version: i64) -> bool {
        self.slow
            .get(&(api_key, request))
            .is_some_and(|(first, last)| (*first..=*last).contains(&api_version))
    }
}

/// Kafka's API keys the core's own steps name (the SASL handshake's state, Produce's acks).
pub const PRODUCE: i64 = 0;
pub const SASL_HANDSHAKE: i64 = 17;
const ENTRY_OVERHEAD: i64 = 16;
const PART_OVERHEAD: i64 = 64;

pub const TRUNCATED: &str = "truncated";
pub const ORIG_SIZE: &str = "orig_size";
pub const HEADER_ERROR: &str = "header_error";
pub const SASL_TOKEN: &str = "sasl_token";

/// A frame as mirrored (`codec.taprecord.Part`), its redacted names joined.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnedPart {
    pub direction: Cow<'static, str>,
    pub ts_ns: i64,
    pub api_key: Option<i64>,
    pub api_version: Option<i64>,
    pub correlation_id: Option<i64>,
    pub redacted: Cow<'static, str>,
    pub flags: Vec<(Cow<'static, str>, String)>,
    pub value: Vec<u8>,
}

impl OwnedPart {
    fn truncated(&self) -> bool {
        self.flags.iter().any(|(k, _)| k == TRUNCATED)
    }
}

pub struct OwnedEntry {
    pub kind: Cow<'static, str>,
    pub seq: i64,
    pub parts: Vec<OwnedPart>,
}

/// Where the caller must decide: the frame, and how far the core got with it.
#[derive(Debug, Clone)]
pub struct Slow {
    pub from_client: bool,
    pub head: Vec<u8>,
    pub size: i64,
    pub api_key: Option<i64>,
    pub api_version: Option<i64>,
    pub correlation_id: Option<i64>,
    pub sensitive: bool,
    pub wall_ns: i64,
    mono_ns: i64,
    /// The response's request, matched already (None for a request).
    held: Option<Option<OwnedPart>>,
}

#[derive(Debug, Default, Clone)]
pub struct Histogram {
    /// Per bucket (the last one +Inf), not cumulative.
    pub buckets: Vec<u64>,
    /// Of the observations, ns.
    pub sum: i64,
}

/// (request?, api key, api version) of a frames counter.
pub type FrameKey = (bool, Option<i64>, Option<i64>);

#[derive(Debug, Default, Clone)]
pub struct Counters {
    /// (request?, api key, api version) -> (frames, bytes with their size prefix)
    pub frames: HashMap<FrameKey, (u64, u64)>,
    pub errors: HashMap<(i64, i64), u64>,
    pub lone: HashMap<&'static str, u64>,
    pub truncated: u64,
    /// (api key, broker?) -> histogram of ns
    pub latency: HashMap<(i64, bool), Histogram>,
    /// Frames handed to Python.
    pub slow: u64,
}

#[derive(Debug, Default)]
struct Sasl {
    client_tokens: i64,
    server_tokens: i64,
    pending_mechanism: Option<String>,
}

impl Sasl {
    fn client_frame_is_token(&mut self) -> bool {
        if self.client_tokens > 0 {
            self.client_tokens -= 1;
            self.server_tokens += 1;
            return true;
        }
        false
    }

    fn server_frame_is_token(&mut self) -> bool {
        if self.server_tokens > 0 {
            self.server_tokens -= 1;
            return true;
        }
        false
    }
}

struct Queued {
    from_client: bool,
    frame: WireFrame,
    wall_ns: i64,
    mono_ns: i64,
    inside_ns: i64,
}

pub struct Core {
    tables: Arc<Tables>,
    settings: Settings,
    static_: Vec<u8>,
    req_split: Splitter,
    resp_split: Splitter,
    /// Frames split but not handled yet (behind a slow frame), both directions in arrival order.
    queue: VecDeque<Queued>,
    correlations: Correlations<OwnedPart>,
    sasl: Sasl,
    slow: Option<Slow>,
    pub seq: i64,
    pub client_name: Vec<u8>,
    pub counters: Counters,
    entries: Vec<OwnedEntry>,
    entry_bytes: i64,
    first_ns: i64,
    due: VecDeque<Vec<OwnedEntry>>,
}

impl Core {
    pub fn new(tables: Arc<Tables>, settings: Settings, static_: Vec<u8>, budget: Arc<Budget>) -> Self {
        let correlations = Correlations::new(settings.hold, budget, tables.rebalance_waits.clone());
        Core {
            req_split: Splitter::new(settings.retain, settings.max_frame, settings.head_bytes),
            resp_split: Splitter::new(settings.retain, settings.max_frame, settings.head_bytes),
            tables,
            settings,
            static_,
            queue: VecDeque::new(),
            correlations,
            sasl: Sasl::default(),
            slow: None,
            seq: 0,
            client_name: Vec::new(),
            counters: Counters::default(),
            entries: Vec::new(),
            entry_bytes: 0,
            first_ns: 0,
            due: VecDeque::new(),
        }
    }

    pub fn slow(&self) -> Option<&Slow> {
        self.slow.as_ref()
    }

    pub fn mid_frame(&self) -> bool {
        self.req_split.mid_frame() || self.resp_split.mid_frame()
    }

    pub fn held_bytes(&self) -> i64 {
        self.correlations.held_bytes()
    }

    /// (api key, version) of the request `corr` answers, while it waits (address rewriting's look-up).
    pub fn pending(&self, corr: i64) -> Option<(i64, i64)> {
        self.correlations.peek(corr).map(|p| (p.api_key, p.api_version))
    }

    /// Frame `data` and handle every complete frame in order; the number handled. Stops at a slow frame.
    pub fn feed(
        &mut self,
        from_client: bool,
        data: &[u8],
        wall_ns: i64,
        mono_ns: i64,
        inside_ns: i64,
    ) -> Result<usize, FrameError> {
        if !data.is_empty() {
            let queue = &mut self.queue;
            let before = queue.len();
            let split = if from_client {
                &mut self.req_split
            } else {
                &mut self.resp_split
            };
            let result = split.feed(data, |frame| {
                queue.push_back(Queued {
                    from_client,
                    frame,
                    wall_ns,
                    mono_ns,
                    inside_ns,
                })
            });
            if let Err(err) = result {
                // As the reference: no frame of a chunk with a bad size is handled.
                queue.truncate(before);
                return Err(err);
            }
        }
        let mut handled = 0;
        while self.slow.is_none() {
            let Some(q) = self.queue.pop_front() else {
                break;
            };
            if q.from_client {
                self.on_request(q);
            } else {
                self.on_response(q);
            }
            handled += 1;
        }
        Ok(handled)
    }

    fn count_frame(&mut self, request: bool, api_key: Option<i64>, api_version: Option<i64>, size: i64) {
        let entry = self
            .counters
            .frames
            .entry((request, api_key, api_version))
            .or_default();
        entry.0 += 1;
        entry.1 += (size + 4) as u64;
    }

    fn observe(&mut self, api_key: i64, broker: bool, ns: i64) {
        let bounds = &self.tables.latency_buckets_ns;
        let hist = self
            .counters
            .latency
            .entry((api_key, broker))
            .or_insert_with(|| Histogram {
                buckets: vec![0; bounds.len() + 1],
                sum: 0,
            });
        let at = bounds.iter().position(|b| ns <= *b).unwrap_or(bounds.len());
        hist.buckets[at] += 1;
        hist.sum += ns;
    }

    fn on_request(&mut self, q: Queued) {
        let Queued {
            frame,
            wall_ns,
            mono_ns,
            inside_ns,
            ..
        } = q;
        let size = i64::from(frame.size);
        if self.sasl.client_frame_is_token() {
            self.count_frame(true, None, None, size);
            let part = self.token_part("req", size, wall_ns);
            self.write_lone(part, SASL_TOKEN, mono_ns);
            return;
        }
        let header = match peek::peek_request_header(&frame.head) {
            Ok(h) => (
                h.api_key,
                h.api_version,
                h.correlation_id,
                h.client_id.map(<[u8]>::to_vec),
            ),
            Err(_) => {
                self.count_frame(true, None, None, size);
                let part = self.part(true, frame.head, size, None, None, None, wall_ns);
                self.write_lone(part.ok().flatten(), "not_a_request", mono_ns);
                return;
            }
        };
        let (api_key, api_version, corr, client_id) = header;
        let (api_key, api_version, corr) = (i64::from(api_key), i64::from(api_version), i64::from(corr));
        self.count_frame(true, Some(api_key), Some(api_version), size);
        self.observe(api_key, false, inside_ns);
        if let Some(raw) = client_id {
            if self.client_name.is_empty() {
                self.client_name = String::from_utf8_lossy(&raw).into_owned().into_bytes();
            }
        }
        let slow = self.tables.is_slow(api_key, true, api_version)
            && (self.settings.mirror || api_key == SASL_HANDSHAKE);
        let answered = self.answered(&frame.head, api_key, api_version);
        let part = if slow {
            Err(frame.head)
        } else {
            self.part(
                true,
                frame.head,
                size,
                Some(api_key),
                Some(api_version),
                Some(corr),
                wall_ns,
            )
        };
        match part {
            Ok(part) => self.track_request(answered, api_key, api_version, corr, false, part, mono_ns),
            Err(head) => {
                self.counters.slow += 1;
                self.slow = Some(Slow {
                    from_client: true,
                    head,
                    size,
                    api_key: Some(api_key),
                    api_version: Some(api_version),
                    correlation_id: Some(corr),
                    sensitive: false,
                    wall_ns,
                    mono_ns,
                    held: None,
                });
            }
        }
    }

    /// Whether the broker answers this request: every request but a Produce with acks=0.
    fn answered(&self, head: &[u8], api_key: i64, api_version: i64) -> bool {
        api_key != PRODUCE || self.tables.produce.expects_response(head, api_key, api_version)
    }

    #[allow(clippy::too_many_arguments)]
    fn track_request(
        &mut self,
        answered: bool,
        api_key: i64,
        api_version: i64,
        corr: i64,
        sensitive: bool,
        part: Option<OwnedPart>,
        mono_ns: i64,
    ) {
        if !answered {
            self.write_lone(part, "no_response", mono_ns);
            return;
        }
        let held_size = part.as_ref().map_or(0, |p| p.value.len() as i64);
        let pending = Pending {
            api_key,
            api_version,
            forwarded_ns: mono_ns,
            sensitive,
            held: part,
            held_bytes: 0,
        };
        let mut out = Vec::new();
        self.correlations.add(corr, pending, held_size, &mut out);
        self.correlations.expire(mono_ns, &mut out);
        self.write_unpaired(out, mono_ns);
    }

    fn on_response(&mut self, q: Queued) {
        let Queued {
            frame,
            wall_ns,
            mono_ns,
            inside_ns,
            ..
        } = q;
        let size = i64::from(frame.size);
        if self.sasl.server_frame_is_token() {
            self.count_frame(false, None, None, size);
            let part = self.token_part("resp", size, wall_ns);
            self.write_lone(part, SASL_TOKEN, mono_ns);
            return;
        }
        let mut corr = None;
        let mut pending = None;
        if frame.head.len() >= 4 {
            let c = i64::from(i32::from_be_bytes([
                frame.head[0],
                frame.head[1],
                frame.head[2],
                frame.head[3],
            ]));
            corr = Some(c);
            let mut orphans = Vec::new();
            pending = self.correlations.match_response(c, &mut orphans);
            self.write_unpaired(orphans, mono_ns);
        }
        let Some(mut pending) = pending else {
            self.count_frame(false, None, None, size);
            let part = self.part(false, frame.head, size, None, None, corr, wall_ns);
            self.write_lone(part.ok().flatten(), "unknown_request", mono_ns);
            return;
        };
        let (api_key, api_version) = (pending.api_key, pending.api_version);
        self.count_frame(false, Some(api_key), Some(api_version), size);
        self.observe(api_key, false, inside_ns);
        self.observe(api_key, true, mono_ns - pending.forwarded_ns);
        let mut error_code = None;
        if let Some(&(first, offset)) = self.tables.error_offsets.get(&api_key) {
            if api_version >= first {
                if let Some(end) = self.header_end(&frame.head, false, Some(api_key), Some(api_version)) {
                    let pos = end + offset;
                    if pos + 2 <= frame.head.len() {
                        error_code = Some(i64::from(i16::from_be_bytes([
                            frame.head[pos],
                            frame.head[pos + 1],
                        ])));
                    }
                }
                if let Some(code) = error_code.filter(|c| *c != 0) {
                    *self.counters.errors.entry((api_key, code)).or_default() += 1;
                }
            }
        }
        if api_key == SASL_HANDSHAKE {
            if let Some(mechanism) = self.sasl.pending_mechanism.take() {
                if error_code == Some(0) {
                    let tables = &self.tables;
                    self.sasl.client_tokens = *tables
                        .sasl_rounds
                        .get(&mechanism.to_uppercase())
                        .unwrap_or(&tables.sasl_other_rounds);
                }
            }
        }
        let held = pending.held.take();
        let slow =
            self.settings.mirror && (pending.sensitive || self.tables.is_slow(api_key, false, api_version));
        let part = if slow {
            Err(frame.head)
        } else {
            self.part(
                false,
                frame.head,
                size,
                Some(api_key),
                Some(api_version),
                corr,
                wall_ns,
            )
        };
        match part {
            Ok(part) => self.pair(held, part, mono_ns),
            Err(head) => {
                self.counters.slow += 1;
                self.slow = Some(Slow {
                    from_client: false,
                    head,
                    size,
                    api_key: Some(api_key),
                    api_version: Some(api_version),
                    correlation_id: corr,
                    sensitive: pending.sensitive,
                    wall_ns,
                    mono_ns,
                    held: Some(held),
                });
            }
        }
    }

    fn pair(&mut self, held: Option<OwnedPart>, part: Option<OwnedPart>, mono_ns: i64) {
        match (held, part) {
            (Some(held), Some(part)) => {
                if (held.value.len() + part.value.len()) as i64 > self.settings.max_mirrored {
                    self.write_lone(Some(held), "exchange_too_large", mono_ns);
                    self.write_lone(Some(part), "exchange_too_large", mono_ns);
                } else {
                    self.write(Cow::Borrowed("ex"), vec![held, part], mono_ns);
                }
            }
            (_, part) => self.write_lone(part, "request_written", mono_ns),
        }
    }

    /// Python's capture of the slow frame (None when mirroring is off); `mechanism`: a SaslHandshake
    /// v0 request's, `sensitive`: whether a request's response must be hidden (an Envelope). False
    /// when no frame waits.
    pub fn resolve(&mut self, part: Option<OwnedPart>, mechanism: Option<String>, sensitive: bool) -> bool {
        let Some(slow) = self.slow.take() else {
            return false;
        };
        if let Some(p) = &part {
            if p.truncated() {
                self.counters.truncated += 1;
            }
        }
        if slow.from_client && slow.api_key == Some(SASL_HANDSHAKE) && slow.api_version == Some(0) {
            self.sasl.pending_mechanism = Some(mechanism.unwrap_or_default());
        }
        let part = if self.settings.mirror { part } else { None };
        match slow.held {
            None => {
                let (api_key, api_version) = (slow.api_key.unwrap_or(-1), slow.api_version.unwrap_or(-1));
                let corr = slow.correlation_id.unwrap_or(0);
                let answered = self.answered(&slow.head, api_key, api_version);
                self.track_request(
                    answered,
                    api_key,
                    api_version,
                    corr,
                    sensitive,
                    part,
                    slow.mono_ns,
                );
            }
            Some(held) => self.pair(held, part, slow.mono_ns),
        }
        true
    }

    fn token_part(&mut self, direction: &'static str, size: i64, wall_ns: i64) -> Option<OwnedPart> {
        if !self.settings.mirror {
            return None;
        }
        Some(OwnedPart {
            direction: Cow::Borrowed(direction),
            ts_ns: wall_ns,
            api_key: None,
            api_version: None,
            correlation_id: None,
            redacted: Cow::Borrowed(SASL_TOKEN),
            flags: vec![(Cow::Borrowed(ORIG_SIZE), size.to_string())],
            value: Vec::new(),
        })
    }

    /// `tap.capture.header_end`, None where it raises.
    fn header_end(
        &self,
        head: &[u8],
        request: bool,
        api_key: Option<i64>,
        api_version: Option<i64>,
    ) -> Option<usize> {
        if head.len() < 4 {
            return None;
        }
        if request {
            let key = (
                i64::from(i16::from_be_bytes([head[0], head[1]])),
                i64::from(i16::from_be_bytes([head[2], head[3]])),
            );
            let version = *self.tables.request_headers.get(&key)?;
            return peek::request_header_end(head, version);
        }
        let (Some(api_key), Some(api_version)) = (api_key, api_version) else {
            return Some(4);
        };
        let version = self
            .tables
            .response_headers
            .get(&(api_key, api_version))
            .copied()
            .unwrap_or(0);
        if version == 0 {
            return Some(4);
        }
        let (count, mut pos) = capture_uvarint(head, 4)?;
        for _ in 0..count {
            let (_, p) = capture_uvarint(head, pos)?;
            let (size, p) = capture_uvarint(head, p)?;
            pos = p.checked_add(size as usize)?;
        }
        (pos <= head.len()).then_some(pos)
    }

    /// `tap.capture.capture` for the frames the core captures itself, stamped as `_part` does: None
    /// when mirroring is off, Err (the frame given back) when Python must capture it. A frame mirrored
    /// whole becomes the part's value without a copy.
    #[allow(clippy::too_many_arguments)]
    fn part(
        &mut self,
        request: bool,
        head: Vec<u8>,
        size: i64,
        api_key: Option<i64>,
        api_version: Option<i64>,
        corr: Option<i64>,
        wall_ns: i64,
    ) -> Result<Option<OwnedPart>, Vec<u8>> {
        if !self.settings.mirror {
            return Ok(None);
        }
        let max = self.settings.max_mirrored;
        let mut flags: Vec<(Cow<'static, str>, String)> = Vec::new();
        let mut value: Option<Vec<u8>> = None;
        let mut header_only = self.settings.policy == Policy::Meta;
        if !header_only && ((head.len() as i64) < size || size > max) {
            flags.push((Cow::Borrowed(TRUNCATED), "1".into()));
            flags.push((Cow::Borrowed(ORIG_SIZE), size.to_string()));
            header_only = true;
        }
        if !header_only {
            if let (Policy::Headers, Some(key)) = (self.settings.policy, api_key) {
                if self.tables.records.contains(&(key, request)) {
                    match self.stripped(&head, request, key, api_version) {
                        Some(stripped) => value = Some(stripped),
                        None => return Err(head),
                    }
                }
            }
            let len = value.as_ref().map_or(head.len(), Vec::len);
            if len as i64 > max {
                flags.push((Cow::Borrowed(TRUNCATED), "1".into()));
                flags.push((Cow::Borrowed(ORIG_SIZE), size.to_string()));
                header_only = true;
            }
        }
        let value = if header_only {
            match self.header_end(&head, request, api_key, api_version) {
                Some(end) => head[..end].to_vec(),
                None => {
                    flags.push((Cow::Borrowed(HEADER_ERROR), "1".into()));
                    Vec::new()
                }
            }
        } else {
            value.unwrap_or(head)
        };
        let part = OwnedPart {
            direction: Cow::Borrowed(if request { "req" } else { "resp" }),
            ts_ns: wall_ns,
            api_key,
            api_version,
            correlation_id: corr,
            redacted: Cow::Borrowed(""),
            flags,
            value,
        };
        if part.truncated() {
            self.counters.truncated += 1;
        }
        Ok(Some(part))
    }

    /// The `headers` policy's value of a record-carrying frame, None where Python must strip it.
    fn stripped(
        &self,
        head: &[u8],
        request: bool,
        api_key: i64,
        api_version: Option<i64>,
    ) -> Option<Vec<u8>> {
        let version = api_version?;
        let plan = self.tables.strip_plans.get(&(api_key, request, version))?;
        let body = self.header_end(head, request, Some(api_key), api_version)?;
        strip::strip_frame(head, body, plan)
    }

    fn write_unpaired(&mut self, out: Vec<(OwnedPart, Reason)>, mono_ns: i64) {
        for (held, reason) in out {
            self.write_lone(Some(held), reason.name(), mono_ns);
        }
    }

    fn write_lone(&mut self, part: Option<OwnedPart>, reason: &'static str, mono_ns: i64) {
        let Some(part) = part else {
            self.seq += 1;
            return;
        };
        *self.counters.lone.entry(reason).or_default() += 1;
        let kind = part.direction.clone();
        self.write(kind, vec![part], mono_ns);
    }

    /// `TapConnection._write`: number the entry and gather it (`FlushBuffer.add`).
    fn write(&mut self, kind: Cow<'static, str>, parts: Vec<OwnedPart>, now_ns: i64) {
        self.seq += 1;
        if !self.settings.mirror {
            return;
        }
        let size = parts
            .iter()
            .map(|p| p.value.len() as i64 + PART_OVERHEAD)
            .sum::<i64>()
            + ENTRY_OVERHEAD;
        if !self.entries.is_empty()
            && (self.entry_bytes + size > self.settings.flush_max_bytes
                || now_ns >= self.first_ns + self.settings.flush_max_age_ns)
        {
            self.take_due();
        }
        if self.entries.is_empty() {
            self.first_ns = now_ns;
        }
        self.entries.push(OwnedEntry {
            kind,
            seq: self.seq,
            parts,
        });
        self.entry_bytes += size;
        if self.entries.len() >= self.settings.flush_max_entries
            || self.entry_bytes >= self.settings.flush_max_bytes
        {
            self.take_due();
        }
    }

    fn take_due(&mut self) {
        let entries = std::mem::take(&mut self.entries);
        self.entry_bytes = 0;
        self.due.push_back(entries);
    }

    /// A lifecycle entry (open, close, blind), its part made in Python (None: mirroring is off).
    pub fn lifecycle(&mut self, kind: String, part: Option<OwnedPart>, mono_ns: i64) {
        match part {
            Some(part) => self.write(Cow::Owned(kind), vec![part], mono_ns),
            None => self.seq += 1,
        }
    }

    /// Held requests past their age bound go out alone.
    pub fn expire(&mut self, mono_ns: i64) {
        let mut out = Vec::new();
        self.correlations.expire(mono_ns, &mut out);
        self.write_unpaired(out, mono_ns);
    }

    /// Every held request goes out alone (the connection closes), before its close entry.
    pub fn drain(&mut self, mono_ns: i64) {
        let mut out = Vec::new();
        self.correlations.drain(&mut out);
        self.write_unpaired(out, mono_ns);
    }

    pub fn due_ns(&self) -> Option<i64> {
        (!self.entries.is_empty()).then(|| self.first_ns + self.settings.flush_max_age_ns)
    }

    /// The next record due by the size or count bound, packed with the loss count as of now, and how
    /// many entries it holds.
    pub fn take_record(&mut self, lost: i64, loss_ns: i64) -> Option<(Vec<u8>, usize)> {
        let entries = self.due.pop_front()?;
        Some((self.pack(&entries, lost, loss_ns), entries.len()))
    }

    /// Everything gathered (the age bound passed, the connection closed, the tap stops).
    pub fn flush(&mut self, lost: i64, loss_ns: i64) -> Option<(Vec<u8>, usize)> {
        if self.entries.is_empty() {
            return None;
        }
        let entries = std::mem::take(&mut self.entries);
        self.entry_bytes = 0;
        Some((self.pack(&entries, lost, loss_ns), entries.len()))
    }

    fn pack(&self, entries: &[OwnedEntry], lost: i64, loss_ns: i64) -> Vec<u8> {
        let flags: Vec<Vec<Vec<(&str, &str)>>> = entries
            .iter()
            .map(|e| {
                e.parts
                    .iter()
                    .map(|p| p.flags.iter().map(|(k, v)| (k.as_ref(), v.as_str())).collect())
                    .collect()
            })
            .collect();
        let parts: Vec<Vec<msgpack::Part<'_>>> = entries
            .iter()
            .zip(&flags)
            .map(|(e, f)| {
                e.parts
                    .iter()
                    .zip(f)
                    .map(|(p, f)| msgpack::Part {
                        direction: &p.direction,
                        ts_ns: p.ts_ns,
                        api_key: p.api_key,
                        api_version: p.api_version,
                        correlation_id: p.correlation_id,
                        redacted: &p.redacted,
                        flags: f,
                        value: &p.value,
                    })
                    .collect()
            })
            .collect();
        let packed: Vec<msgpack::Entry<'_>> = entries
            .iter()
            .zip(&parts)
            .map(|(e, p)| msgpack::Entry {
                kind: &e.kind,
                seq: e.seq,
                parts: p,
            })
            .collect();
        msgpack::pack_flush(&self.static_, &packed, lost, loss_ns)
    }
}

/// `tap.capture._uvarint`: the shift is checked before each byte.
fn capture_uvarint(buf: &[u8], mut pos: usize) -> Option<(u64, usize)> {
    let mut value: u64 = 0;
    let mut shift = 0u32;
    loop {
        if pos >= buf.len() || shift > 28 {
            return None;
        }
        let b = buf[pos];
        pos += 1;
        value |= u64::from(b & 0x7F) << shift;
        if b & 0x80 == 0 {
            return Some((value, pos));
        }
        shift += 7;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tables() -> Arc<Tables> {
        let mut t = Tables {
            latency_buckets_ns: vec![1_000, 1_000_000],
            ..Tables::default()
        };
        // Metadata v1 (header v1, response header v0), and SaslHandshake v0 requests go to Python.
        t.request_headers.insert((3, 1), 1);
        t.request_headers.insert((SASL_HANDSHAKE, 0), 1);
        t.slow.insert((SASL_HANDSHAKE, true), (0, 0));
        Arc::new(t)
    }

    fn settings() -> Settings {
        Settings {
            policy: Policy::Full,
            mirror: true,
            max_mirrored: 1_000,
            max_frame: 1 << 20,
            retain: 1_001,
            head_bytes: 65_536,
            hold: Limits {
                max_in_flight: 10,
                max_bytes: 1 << 20,
                max_age_ns: 1_000_000,
                max_rebalance_age_ns: 1_000_000,
            },
            flush_max_bytes: 1 << 20,
            flush_max_entries: 2,
            flush_max_age_ns: 1_000,
        }
    }

    fn framed(body: &[u8]) -> Vec<u8> {
        let mut out = (body.len() as i32).to_be_bytes().to_vec();
        out.extend_from_slice(body);
        out
    }

    fn request(api_key: i16, corr: i32) -> Vec<u8> {
        let mut out = Vec::new();
        for v in [api_key.to_be_bytes(), [0, if api_key == 3 { 1 } else { 0 }]] {
            out.extend_from_slice(&v);
        }
        out.extend_from_slice(&corr.to_be_bytes());
        out.extend_from_slice(b"\x00\x01c");
        out
    }

    #[test]
    fn an_exchange_is_one_entry_and_a_slow_frame_waits_for_python() {
        let mut core = Core::new(tables(), settings(), b"s".to_vec(), Budget::new(1 << 30));
        // A request and a slow one in one chunk: the core stops at the second.
        let mut chunk = framed(&request(3, 7));
        chunk.extend(framed(&request(SASL_HANDSHAKE as i16, 8)));
        assert_eq!(core.feed(true, &chunk, 1, 10, 0).ok(), Some(2));
        let slow = core.slow().expect("a slow frame").clone();
        assert_eq!(
            (slow.api_key, slow.correlation_id),
            (Some(SASL_HANDSHAKE), Some(8))
        );
        // Nothing more is handled until Python resolves it.
        assert_eq!(
            core.feed(false, &framed(&7i32.to_be_bytes()), 2, 20, 0).ok(),
            Some(0)
        );
        assert!(core.resolve(None, Some("PLAIN".into()), false));
        assert!(!core.resolve(None, None, false));
        assert_eq!(core.feed(false, b"", 2, 20, 0).ok(), Some(1));
        assert_eq!(core.pending(8), Some((SASL_HANDSHAKE, 0)));
        // The Metadata exchange is one entry; the open record (seq 1) is not the core's business.
        let (value, entries) = core.take_record(0, 0).map_or((Vec::new(), 0), |r| r);
        assert_eq!(
            entries, 0,
            "two entries are due only with the flush bound: {value:?}"
        );
        let (value, entries) = core.flush(0, 0).expect("gathered");
        assert_eq!(entries, 1);
        assert_eq!(&value[..4], msgpack::MAGIC_3);
        assert_eq!(core.seq, 1);
        assert_eq!(core.counters.frames[&(true, Some(3), Some(1))], (1, 4 + 11));
        assert_eq!(core.counters.latency[&(3, true)].buckets, vec![1, 0, 0]);
        assert_eq!(core.counters.slow, 1);
        // A bad size: no frame of the chunk is handled.
        let mut bad = framed(&request(3, 9));
        bad.extend_from_slice(&(-1i32).to_be_bytes());
        assert!(core.feed(true, &bad, 3, 30, 0).is_err());
        assert_eq!(core.pending(9), None);
    }
}
