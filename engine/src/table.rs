//! A compact open-addressing table of familiar records: 16-byte digests to packed values.
//!
//! One slot is 40 bytes (the digest, the expiry, the evidence start and the decision id's
//! fingerprint) plus one tag byte in a separate array (0: empty, else 0x80 | 7 bits of the
//! slot's hash), so a probe reads tags (64 to a cache line) and compares a digest only on a
//! tag match. Linear probing with backward-shift deletion: no tombstones, so a table that
//! lifts and prunes never degrades. The capacity is any number of slots (not a power of
//! two: the home slot is a multiply-high range reduction), kept at most `MAX_LOAD` full,
//! so a table reserved for N records costs about 41 / MAX_LOAD bytes per record.
//!
//! The digests are cryptographic, but an attacker who knows their own records' digests
//! could still aim them at one run of slots; the home slot therefore mixes the digest with
//! a per-table random seed (std's `RandomState`), so nobody outside the process can place
//! records next to each other.

use std::collections::hash_map::RandomState;
use std::collections::TryReserveError;
use std::hash::{BuildHasher, Hasher};

pub const KEY_BYTES: usize = 16;
/// A packed record of `put_many`: digest (16), expires_ms (i64 LE), since_ms (i64 LE),
/// the decision id's fingerprint (u64 LE).
pub const RECORD_BYTES: usize = 40;
/// The highest load factor, as a fraction: 85 %.
const MAX_LOAD_NUM: usize = 85;
const MAX_LOAD_DEN: usize = 100;
const MIN_SLOTS: usize = 64;
/// The most records a table is asked to hold (about 100 GB): a larger request is a
/// mistake, refused before any allocation.
pub const MAX_RECORDS: usize = 1 << 31;

pub type Digest = [u8; KEY_BYTES];

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Value {
    pub expires_ms: i64,
    pub since_ms: i64,
    pub id_fp: u64,
}

#[derive(Clone, Copy, Default)]
#[repr(C)]
struct Slot {
    key: Digest,
    value: Value,
}

pub struct Table {
    tags: Vec<u8>,
    slots: Vec<Slot>,
    len: usize,
    seed: (u64, u64),
    cursor: usize,
}

#[inline]
fn fold_mul(a: u64, b: u64) -> u64 {
    let full = (a as u128).wrapping_mul(b as u128);
    (full as u64) ^ ((full >> 64) as u64)
}

fn random_seed() -> (u64, u64) {
    let state = RandomState::new();
    let mut h = state.build_hasher();
    h.write_u64(0x6175_7468_7069_7065);
    let a = h.finish();
    let mut h = state.build_hasher();
    h.write_u64(a);
    (a | 1, h.finish() | 1)
}

/// Slots needed to hold `records` within the load bound.
pub fn slots_for(records: usize) -> usize {
    let wanted = records
        .saturating_mul(MAX_LOAD_DEN)
        .div_ceil(MAX_LOAD_NUM)
        .saturating_add(1);
    wanted.max(MIN_SLOTS)
}

/// Zeroed tags and slots for `n` slots, or the allocator's refusal (never an abort).
fn allocate(n: usize) -> Result<(Vec<u8>, Vec<Slot>), TryReserveError> {
    let mut tags = Vec::new();
    tags.try_reserve_exact(n)?;
    tags.resize(n, 0);
    let mut slots = Vec::new();
    slots.try_reserve_exact(n)?;
    slots.resize(n, Slot::default());
    Ok((tags, slots))
}

impl Table {
    pub fn with_capacity(records: usize) -> Result<Self, TryReserveError> {
        Self::with_seed(records, random_seed())
    }

    pub fn with_seed(records: usize, seed: (u64, u64)) -> Result<Self, TryReserveError> {
        let (tags, slots) = allocate(slots_for(records))?;
        Ok(Table {
            tags,
            slots,
            len: 0,
            seed,
            cursor: 0,
        })
    }

    pub fn len(&self) -> usize {
        self.len
    }

    #[allow(dead_code)]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn slot_count(&self) -> usize {
        self.slots.len()
    }

    /// Bytes the table holds: its slots, its tags and the struct.
    pub fn approx_bytes(&self) -> usize {
        self.slots.capacity() * std::mem::size_of::<Slot>()
            + self.tags.capacity()
            + std::mem::size_of::<Self>()
    }

    #[inline]
    fn hash(&self, key: &Digest) -> u64 {
        let lo = u64::from_le_bytes(key[..8].try_into().unwrap());
        let hi = u64::from_le_bytes(key[8..].try_into().unwrap());
        fold_mul(lo ^ self.seed.0, hi ^ self.seed.1)
    }

    #[inline]
    fn home(&self, hash: u64) -> usize {
        ((hash as u128 * self.slots.len() as u128) >> 64) as usize
    }

    #[inline]
    fn tag(hash: u64) -> u8 {
        0x80 | (hash as u8 & 0x7f)
    }

    #[inline]
    fn next(&self, i: usize) -> usize {
        let j = i + 1;
        if j == self.slots.len() {
            0
        } else {
            j
        }
    }

    fn find(&self, key: &Digest) -> Option<usize> {
        let hash = self.hash(key);
        let tag = Self::tag(hash);
        let mut i = self.home(hash);
        loop {
            let t = self.tags[i];
            if t == 0 {
                return None;
            }
            if t == tag && self.slots[i].key == *key {
                return Some(i);
            }
            i = self.next(i);
        }
    }

    pub fn get(&self, key: &Digest) -> Option<Value> {
        self.find(key).map(|i| self.slots[i].value)
    }

    /// Make room for `more` records beyond those held without growing in between.
    /// Growing by half at least, so loading in chunks without a first reservation rehashes
    /// a logarithmic number of times, not once per chunk.
    pub fn reserve(&mut self, more: usize) -> Result<(), TryReserveError> {
        let needed = slots_for(self.len.saturating_add(more));
        if needed > self.slots.len() {
            let grown = if self.len == 0 {
                needed
            } else {
                needed.max(self.slots.len() + self.slots.len() / 2)
            };
            self.rehash(grown)?;
        }
        Ok(())
    }

    /// Move every record into `slots` new slots; on an allocation failure nothing changes.
    fn rehash(&mut self, slots: usize) -> Result<(), TryReserveError> {
        let (tags, new_slots) = allocate(slots)?;
        let old_tags = std::mem::replace(&mut self.tags, tags);
        let old_slots = std::mem::replace(&mut self.slots, new_slots);
        self.cursor = 0;
        for (t, s) in old_tags.iter().zip(old_slots.iter()) {
            if *t != 0 {
                self.place(s.key, s.value);
            }
        }
        Ok(())
    }

    /// Put a record known to be absent into the first free slot from its home.
    fn place(&mut self, key: Digest, value: Value) {
        let hash = self.hash(&key);
        let mut i = self.home(hash);
        while self.tags[i] != 0 {
            i = self.next(i);
        }
        self.tags[i] = Self::tag(hash);
        self.slots[i] = Slot { key, value };
    }

    /// Insert or replace (the last record put for a digest wins, as a compacted topic's);
    /// growing by half when full. On an allocation failure nothing changes.
    pub fn put(&mut self, key: Digest, value: Value) -> Result<(), TryReserveError> {
        if let Some(i) = self.find(&key) {
            self.slots[i].value = value;
            return Ok(());
        }
        if (self.len + 1) * MAX_LOAD_DEN > self.slots.len() * MAX_LOAD_NUM {
            let grown = self.slots.len() + self.slots.len() / 2;
            self.rehash(grown.max(slots_for(self.len + 1)))?;
        }
        self.place(key, value);
        self.len += 1;
        Ok(())
    }

    /// Remove `key`'s record, only if its id fingerprint is `id_fp` when one is given;
    /// returns the record removed.
    pub fn lift(&mut self, key: &Digest, id_fp: Option<u64>) -> Option<Value> {
        let i = self.find(key)?;
        let value = self.slots[i].value;
        if let Some(fp) = id_fp {
            if fp != value.id_fp {
                return None;
            }
        }
        self.remove_at(i);
        Some(value)
    }

    /// Empty slot `i` and shift the run after it back (no tombstones).
    fn remove_at(&mut self, i: usize) {
        let n = self.slots.len();
        let mut hole = i;
        let mut j = self.next(i);
        loop {
            if self.tags[j] == 0 {
                break;
            }
            let home = self.home(self.hash(&self.slots[j].key));
            // j may move into the hole unless its home lies cyclically in (hole, j].
            let from_home = (j + n - home) % n;
            let from_hole = (j + n - hole) % n;
            if from_home >= from_hole {
                self.tags[hole] = self.tags[j];
                self.slots[hole] = self.slots[j];
                hole = j;
            }
            j = self.next(j);
        }
        self.tags[hole] = 0;
        self.slots[hole] = Slot::default();
        self.len -= 1;
    }

    /// Remove the records in slots `[start, end)` expired at `now_ms` (expiry at or
    /// before it), calling `removed` with each digest; returns how many.
    fn sweep(
        &mut self,
        start: usize,
        end: usize,
        now_ms: i64,
        removed: &mut dyn FnMut(&Digest),
    ) -> usize {
        let mut count = 0;
        for i in start..end {
            // A removal shifts a later record into slot i: look at it again.
            while self.tags[i] != 0 && self.slots[i].value.expires_ms <= now_ms {
                removed(&self.slots[i].key);
                self.remove_at(i);
                count += 1;
            }
        }
        count
    }

    /// Remove every record expired at `now_ms`; returns how many (a scan of every slot).
    pub fn prune(&mut self, now_ms: i64, removed: &mut dyn FnMut(&Digest)) -> usize {
        let n = self.slots.len();
        self.sweep(0, n, now_ms, removed)
    }

    /// Remove the records expired at `now_ms` among the next `max_slots` slots after the
    /// previous call's, wrapping around: a bounded step of a sweep that covers the whole
    /// table every `slot_count / max_slots` calls. Returns how many were removed.
    pub fn prune_step(&mut self, now_ms: i64, max_slots: usize) -> usize {
        let n = self.slots.len();
        let start = if self.cursor >= n { 0 } else { self.cursor };
        let end = start.saturating_add(max_slots.max(1)).min(n);
        let count = self.sweep(start, end, now_ms, &mut |_| {});
        self.cursor = if end >= n { 0 } else { end };
        count
    }

    /// Records alive at `now_ms` (expiry after it): a scan of every slot.
    pub fn count_alive(&self, now_ms: i64) -> usize {
        self.tags
            .iter()
            .zip(self.slots.iter())
            .filter(|(t, s)| **t != 0 && s.value.expires_ms > now_ms)
            .count()
    }

    /// Every record, in slot order.
    pub fn for_each(&self, f: &mut dyn FnMut(&Digest, &Value)) {
        for (t, s) in self.tags.iter().zip(self.slots.iter()) {
            if *t != 0 {
                f(&s.key, &s.value);
            }
        }
    }
}

/// A record of `put_many`'s packed bytes.
pub fn unpack(record: &[u8]) -> (Digest, Value) {
    let key: Digest = record[..16].try_into().unwrap();
    let expires_ms = i64::from_le_bytes(record[16..24].try_into().unwrap());
    let since_ms = i64::from_le_bytes(record[24..32].try_into().unwrap());
    let id_fp = u64::from_le_bytes(record[32..40].try_into().unwrap());
    (
        key,
        Value {
            expires_ms,
            since_ms,
            id_fp,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn key(n: u64) -> Digest {
        let mut k = [0u8; 16];
        k[..8].copy_from_slice(&n.to_le_bytes());
        k
    }

    fn value(e: i64, fp: u64) -> Value {
        Value {
            expires_ms: e,
            since_ms: -1,
            id_fp: fp,
        }
    }

    #[test]
    fn against_a_hash_map_with_collisions_forced() {
        // A seed of (1, 1) and keys differing only in the low half: many share a home.
        let mut t = Table::with_seed(0, (1, 1)).unwrap();
        let mut m: HashMap<Digest, Value> = HashMap::new();
        let mut x: u64 = 0x1234_5678;
        for step in 0..200_000u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let k = key(x % 3_000);
            match x % 7 {
                0..=2 => {
                    let v = value((x % 1_000) as i64, step);
                    t.put(k, v).unwrap();
                    m.insert(k, v);
                }
                3 => {
                    let fp = if x % 2 == 0 {
                        None
                    } else {
                        m.get(&k).map(|v| v.id_fp)
                    };
                    assert_eq!(t.lift(&k, fp), m.remove(&k));
                }
                4 if step % 97 == 0 => {
                    let now = (x % 1_000) as i64;
                    let before = m.len();
                    m.retain(|_, v| v.expires_ms > now);
                    assert_eq!(t.prune(now, &mut |_| {}), before - m.len());
                }
                5 if step % 13 == 0 => {
                    let now = (x % 1_000) as i64;
                    let removed = t.prune_step(now, 50);
                    let gone: Vec<Digest> =
                        m.keys().filter(|k| t.get(k).is_none()).copied().collect();
                    assert_eq!(gone.len(), removed);
                    for k in gone {
                        assert!(m.remove(&k).unwrap().expires_ms <= now);
                    }
                }
                _ => assert_eq!(t.get(&k), m.get(&k).copied()),
            }
            assert_eq!(t.len(), m.len());
        }
        for (k, v) in &m {
            assert_eq!(t.get(k), Some(*v));
        }
    }

    #[test]
    fn load_stays_bounded() {
        let mut t = Table::with_capacity(0).unwrap();
        for n in 0..100_000u64 {
            t.put(key(n.wrapping_mul(0x9E37_79B9_7F4A_7C15)), value(1, n))
                .unwrap();
        }
        assert_eq!(t.len(), 100_000);
        assert!(t.len() * 100 <= t.slot_count() * 85);
    }

    #[test]
    fn reserve_holds_exactly_without_growing() {
        let mut t = Table::with_capacity(1_000_000).unwrap();
        let slots = t.slot_count();
        for n in 0..1_000_000u64 {
            t.put(key(n.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 7), value(1, n))
                .unwrap();
        }
        assert_eq!(t.slot_count(), slots);
    }
}
