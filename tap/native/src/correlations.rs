//! Request/response pairing by correlation id with the hold bounds: the native twin of
//! `tap.framing.Correlations` (and `HeldBudget`), generic over what a held request is, so the
//! per-connection core can hold its own frames and the Python binding Python objects.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicI64, Ordering::Relaxed};
use std::sync::Arc;

/// Bytes of held requests shared by every connection of a tap.
#[derive(Debug)]
/// Atomics only so that a core may be moved between threads: the callers serialise access (the GIL,
/// or one I/O thread), so a plain load and store suffice.
pub struct Budget {
    pub limit: AtomicI64,
    pub held: AtomicI64,
}

impl Budget {
    pub fn new(limit: i64) -> Arc<Self> {
        Arc::new(Budget {
            limit: AtomicI64::new(limit),
            held: AtomicI64::new(0),
        })
    }

    pub fn held(&self) -> i64 {
        self.held.load(Relaxed)
    }

    pub fn limit(&self) -> i64 {
        self.limit.load(Relaxed)
    }

    pub fn take(&self, size: i64) -> bool {
        let held = self.held.load(Relaxed);
        if held + size > self.limit.load(Relaxed) {
            return false;
        }
        self.held.store(held + size, Relaxed);
        true
    }

    pub fn give(&self, size: i64) {
        self.held.store(self.held.load(Relaxed) - size, Relaxed);
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub max_in_flight: i64,
    pub max_bytes: i64,
    pub max_age_ns: i64,
    pub max_rebalance_age_ns: i64,
}

/// Why a held request went out alone (those of `tap.framing.LONE_REASONS` the pairing gives).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    Unanswered,
    InFlightCap,
    HeldBytes,
    HeldAge,
    Closed,
}

impl Reason {
    pub fn name(self) -> &'static str {
        match self {
            Reason::Unanswered => "unanswered",
            Reason::InFlightCap => "in_flight_cap",
            Reason::HeldBytes => "held_bytes",
            Reason::HeldAge => "held_age",
            Reason::Closed => "closed",
        }
    }
}

/// An in-flight request (`tap.framing.Pending`).
#[derive(Debug, Clone)]
pub struct Pending<H> {
    pub api_key: i64,
    pub api_version: i64,
    pub forwarded_ns: i64,
    pub sensitive: bool,
    pub held: Option<H>,
    pub held_bytes: i64,
}

pub struct Correlations<H> {
    /// In the order requests were tracked (a reused id moves to the back): order number -> entry.
    pending: BTreeMap<u64, (i64, Pending<H>)>,
    by_corr: HashMap<i64, u64>,
    limits: Limits,
    rebalance_waits: Vec<i64>,
    budget: Arc<Budget>,
    bytes: i64,
    next: u64,
}

impl<H> Correlations<H> {
    pub fn new(limits: Limits, budget: Arc<Budget>, rebalance_waits: Vec<i64>) -> Self {
        Correlations {
            pending: BTreeMap::new(),
            by_corr: HashMap::new(),
            limits,
            rebalance_waits,
            budget,
            bytes: 0,
            next: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.pending.len()
    }

    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    pub fn held_bytes(&self) -> i64 {
        self.bytes
    }

    fn remove(&mut self, corr: i64) -> Option<(u64, Pending<H>)> {
        let order = self.by_corr.remove(&corr)?;
        let (_, pending) = self.pending.remove(&order).expect("indexed entry");
        Some((order, pending))
    }

    fn unhold(&mut self, pending: &mut Pending<H>) -> Option<H> {
        self.bytes -= pending.held_bytes;
        self.budget.give(pending.held_bytes);
        pending.held_bytes = 0;
        pending.held.take()
    }

    fn release(&mut self, pending: &mut Pending<H>, reason: Reason, out: &mut Vec<(H, Reason)>) {
        if pending.held.is_some() {
            if let Some(held) = self.unhold(pending) {
                out.push((held, reason));
            }
        }
    }

    fn release_oldest_held(&mut self, reason: Reason, out: &mut Vec<(H, Reason)>) -> bool {
        let Some(order) = self
            .pending
            .iter()
            .find(|(_, (_, p))| p.held.is_some())
            .map(|(o, _)| *o)
        else {
            return false;
        };
        let mut entry = self.pending.remove(&order).expect("found entry");
        self.release(&mut entry.1, reason, out);
        self.pending.insert(order, entry);
        true
    }

    /// Track a request, holding `pending.held` (of `size` bytes) while the bounds allow; what must be
    /// written alone now goes to `out`.
    pub fn add(&mut self, corr: i64, mut pending: Pending<H>, size: i64, out: &mut Vec<(H, Reason)>) {
        self.next += 1;
        if let Some((_, mut old)) = self.remove(corr) {
            self.release(&mut old, Reason::Unanswered, out);
        }
        if pending.held.is_some() {
            let max_bytes = self.limits.max_bytes;
            while self.bytes + size > max_bytes && self.release_oldest_held(Reason::HeldBytes, out) {}
            if self.bytes + size > max_bytes || !self.budget.take(size) {
                if let Some(held) = pending.held.take() {
                    out.push((held, Reason::HeldBytes));
                }
            } else {
                pending.held_bytes = size;
                self.bytes += size;
            }
        }
        let order = self.next;
        self.pending.insert(order, (corr, pending));
        self.by_corr.insert(corr, order);
        if self.pending.len() as i64 > self.limits.max_in_flight {
            if let Some((_, (evicted_corr, mut evicted))) = self.pending.pop_first() {
                self.by_corr.remove(&evicted_corr);
                self.release(&mut evicted, Reason::InFlightCap, out);
            }
        }
    }

    pub fn peek(&self, corr: i64) -> Option<&Pending<H>> {
        let order = self.by_corr.get(&corr)?;
        self.pending.get(order).map(|(_, p)| p)
    }

    /// The request `corr` answers (its held frame is the caller's now and no longer counted); the
    /// older requests, which will never be answered, go to `orphans`.
    pub fn match_response(&mut self, corr: i64, orphans: &mut Vec<(H, Reason)>) -> Option<Pending<H>> {
        let (order, mut found) = self.remove(corr)?;
        // Responses come in request order: anything older than this one will never be answered.
        while let Some(entry) = self.pending.first_entry() {
            if *entry.key() > order {
                break;
            }
            let (oldest_corr, mut oldest) = entry.remove();
            self.by_corr.remove(&oldest_corr);
            self.release(&mut oldest, Reason::Unanswered, orphans);
        }
        if found.held.is_some() {
            self.bytes -= found.held_bytes;
            self.budget.give(found.held_bytes);
            found.held_bytes = 0;
        }
        Some(found)
    }

    /// Held frames older than the age bound, handed back; their entries stay.
    pub fn expire(&mut self, now_ns: i64, out: &mut Vec<(H, Reason)>) {
        let cutoff = now_ns.saturating_sub(self.limits.max_age_ns);
        let rebalance_cutoff = now_ns.saturating_sub(self.limits.max_rebalance_age_ns);
        let mut freed: i64 = 0;
        for (_, pending) in self.pending.values_mut() {
            if self.rebalance_waits.contains(&pending.api_key) {
                if pending.forwarded_ns > rebalance_cutoff {
                    continue;
                }
            } else if pending.forwarded_ns > cutoff {
                // Entries are in the order they were forwarded: every later one is younger still.
                break;
            }
            if let Some(held) = pending.held.take() {
                freed += pending.held_bytes;
                self.budget.give(pending.held_bytes);
                pending.held_bytes = 0;
                out.push((held, Reason::HeldAge));
            }
        }
        self.bytes -= freed;
    }

    /// Every held frame, oldest first, and nothing tracked any more.
    pub fn drain(&mut self, out: &mut Vec<(H, Reason)>) {
        let pending = std::mem::take(&mut self.pending);
        self.by_corr.clear();
        for (_, (_, mut p)) in pending {
            self.release(&mut p, Reason::Closed, out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: Limits = Limits {
        max_in_flight: 1_000,
        max_bytes: 1 << 20,
        max_age_ns: 100,
        max_rebalance_age_ns: 1_000,
    };
    const JOIN_GROUP: i64 = 11;

    fn pending(api_key: i64, forwarded_ns: i64, held: &'static str) -> Pending<&'static str> {
        Pending {
            api_key,
            api_version: 9,
            forwarded_ns,
            sensitive: false,
            held: Some(held),
            held_bytes: 0,
        }
    }

    fn tracker(limits: Limits, budget: Arc<Budget>) -> Correlations<&'static str> {
        Correlations::new(limits, budget, vec![JOIN_GROUP])
    }

    #[test]
    fn a_response_releases_the_older_unanswered_requests() {
        let mut c = tracker(LIMITS, Budget::new(1 << 40));
        let mut out = Vec::new();
        for (corr, held) in [(1, "one"), (2, "two"), (3, "three")] {
            c.add(corr, pending(0, corr, held), 10, &mut out);
        }
        assert!(out.is_empty());
        let found = c.match_response(2, &mut out).expect("tracked");
        assert_eq!(found.held, Some("two"));
        assert_eq!(out, vec![("one", Reason::Unanswered)]);
        assert_eq!((c.len(), c.held_bytes()), (1, 10));
        assert!(c.match_response(1, &mut out).is_none());
    }

    #[test]
    fn the_bounds_hand_frames_back() {
        let budget = Budget::new(25);
        let mut a = tracker(
            Limits {
                max_bytes: 20,
                ..LIMITS
            },
            budget.clone(),
        );
        let mut b = tracker(
            Limits {
                max_bytes: 20,
                ..LIMITS
            },
            budget.clone(),
        );
        let mut out = Vec::new();
        a.add(1, pending(0, 1, "a1"), 10, &mut out);
        a.add(2, pending(0, 2, "a2"), 10, &mut out);
        a.add(3, pending(0, 3, "a3"), 10, &mut out);
        assert_eq!(out, vec![("a1", Reason::HeldBytes)]);
        out.clear();
        b.add(7, pending(0, 4, "b7"), 10, &mut out);
        assert_eq!(out, vec![("b7", Reason::HeldBytes)]);
        assert_eq!(budget.held(), 20);
        let mut capped = tracker(
            Limits {
                max_in_flight: 1,
                ..LIMITS
            },
            Budget::new(1 << 40),
        );
        out.clear();
        capped.add(1, pending(0, 1, "c1"), 1, &mut out);
        capped.add(2, pending(0, 2, "c2"), 1, &mut out);
        assert_eq!(out, vec![("c1", Reason::InFlightCap)]);
    }

    #[test]
    fn a_join_group_is_held_to_its_own_age_bound() {
        let mut c = tracker(LIMITS, Budget::new(1 << 40));
        let mut out = Vec::new();
        c.add(1, pending(JOIN_GROUP, 0, "join"), 10, &mut out);
        c.add(2, pending(3, 10, "metadata"), 10, &mut out);
        c.expire(150, &mut out);
        assert_eq!(out, vec![("metadata", Reason::HeldAge)]);
        out.clear();
        c.expire(1_000, &mut out);
        assert_eq!(out, vec![("join", Reason::HeldAge)]);
        out.clear();
        c.drain(&mut out);
        assert!(out.is_empty() && c.is_empty() && c.held_bytes() == 0);
    }
}
