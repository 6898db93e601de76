//! Kafka's record batches (message format v2, KIP-98) as a fetch answer carries them, read
//! without a Python object per record: the decisions topic's cold load (`put_batches`).
//!
//! A fetch's records are whole batches, the last one possibly cut short by the fetch's
//! byte limit. `Batches` walks them: each batch's header is checked (magic 2, its length
//! within the answer, its CRC-32C over attributes to the end), then its records are read
//! (varint lengths, key and value slices into the answer). A batch this reader does not
//! take (another magic, a compression codec, a bad CRC or a record that does not parse)
//! stops the walk at that batch's first offset (`Stop::Unread`), for the caller to leave to
//! a consumer that reads every format and reports every error; a batch cut short ends it
//! (`Stop::Partial`). Control batches (transaction markers) are skipped whole, as a
//! consumer skips them; records before the fetch's offset (a batch starts before it) are
//! skipped too.

const HEADER: usize = 61;
const LOG_OVERHEAD: usize = 12; // base offset (8) and batch length (4)
const CRC_FROM: usize = 21; // attributes onwards
const COMPRESSION_MASK: i16 = 0x07;
const CONTROL: i16 = 0x20;

/// One record of a batch: its offset, key and value (None: null, a tombstone's value).
#[derive(Debug, PartialEq, Eq)]
pub struct Record<'a> {
    pub offset: i64,
    pub key: Option<&'a [u8]>,
    pub value: Option<&'a [u8]>,
}

/// Why the walk ended before the answer's end.
#[derive(Debug, PartialEq, Eq, Clone, Copy)]
pub enum Stop {
    /// Every batch was read.
    End,
    /// The last batch was cut short by the fetch's byte limit: fetch again from `next`.
    Partial,
    /// A batch this reader does not take (format, codec, CRC, a record): its first offset.
    Unread,
}

fn be_i64(b: &[u8], at: usize) -> i64 {
    i64::from_be_bytes(b[at..at + 8].try_into().unwrap_or([0; 8]))
}

fn be_i32(b: &[u8], at: usize) -> i32 {
    i32::from_be_bytes(b[at..at + 4].try_into().unwrap_or([0; 4]))
}

fn be_u32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(b[at..at + 4].try_into().unwrap_or([0; 4]))
}

fn be_i16(b: &[u8], at: usize) -> i16 {
    i16::from_be_bytes(b[at..at + 2].try_into().unwrap_or([0; 2]))
}

/// A zig-zag varint (at most 10 bytes) from `b[*at..]`, moving `at` past it.
fn varint(b: &[u8], at: &mut usize) -> Option<i64> {
    let mut raw: u64 = 0;
    for shift in (0..70).step_by(7) {
        let byte = *b.get(*at)?;
        *at += 1;
        raw |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Some((raw >> 1) as i64 ^ -((raw & 1) as i64));
        }
    }
    None
}

/// `len` bytes at `at` (None for a length of -1: null), moving `at` past them.
fn bytes_of<'a>(b: &'a [u8], at: &mut usize) -> Option<Option<&'a [u8]>> {
    let len = varint(b, at)?;
    if len == -1 {
        return Some(None);
    }
    let len = usize::try_from(len).ok()?;
    let end = at.checked_add(len)?;
    let out = b.get(*at..end)?;
    *at = end;
    Some(Some(out))
}

/// The records of one batch's body (after its header), or None if one does not parse.
fn records<'a>(body: &'a [u8], base: i64, count: i32, out: &mut Vec<Record<'a>>) -> Option<()> {
    let mut at = 0usize;
    for _ in 0..count {
        let len = usize::try_from(varint(body, &mut at)?).ok()?;
        let end = at.checked_add(len)?;
        let rec = body.get(at..end)?;
        let mut r = 1usize; // attributes (unused)
        varint(rec, &mut r)?; // timestamp delta
        let delta = varint(rec, &mut r)?;
        let key = bytes_of(rec, &mut r)?;
        let value = bytes_of(rec, &mut r)?;
        let headers = varint(rec, &mut r)?;
        for _ in 0..headers.max(0) {
            bytes_of(rec, &mut r)?; // a header's key (a length, never null)
            bytes_of(rec, &mut r)?;
        }
        if r != rec.len() {
            return None;
        }
        out.push(Record {
            offset: base.checked_add(delta)?,
            key,
            value,
        });
        at = end;
    }
    (at == body.len()).then_some(())
}

/// The records of a fetch answer `raw` at or after `from_offset`, in order, with the
/// offset to fetch next and why the walk ended.
pub fn read(raw: &[u8], from_offset: i64) -> (Vec<Record<'_>>, i64, Stop) {
    let mut out = Vec::new();
    let mut next = from_offset;
    let mut at = 0usize;
    while at < raw.len() {
        if raw.len() - at < LOG_OVERHEAD {
            return (out, next, Stop::Partial);
        }
        let base = be_i64(raw, at);
        let Ok(length) = usize::try_from(be_i32(raw, at + 8)) else {
            return (out, next, Stop::Unread);
        };
        let size = LOG_OVERHEAD + length;
        if raw.len() - at < size {
            return (out, next, Stop::Partial);
        }
        let batch = &raw[at..at + size];
        if size < HEADER || batch[16] != 2 {
            return (out, next.max(base), Stop::Unread);
        }
        let attributes = be_i16(batch, CRC_FROM);
        let last = base.saturating_add(i64::from(be_i32(batch, 23)));
        if crc32c::crc32c(&batch[CRC_FROM..]) != be_u32(batch, 17)
            || attributes & COMPRESSION_MASK != 0
        {
            return (out, next.max(base), Stop::Unread);
        }
        if attributes & CONTROL == 0 {
            let mut these = Vec::new();
            if records(&batch[HEADER..], base, be_i32(batch, 57), &mut these).is_none() {
                return (out, next.max(base), Stop::Unread);
            }
            out.extend(these.into_iter().filter(|r| r.offset >= from_offset));
        }
        next = next.max(last + 1);
        at += size;
    }
    (out, next, Stop::End)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_are_zigzag() {
        for (raw, want) in [
            (&[0u8][..], 0i64),
            (&[1], -1),
            (&[2], 1),
            (&[0xac, 0x02], 150),
        ] {
            let mut at = 0;
            assert_eq!(varint(raw, &mut at), Some(want));
            assert_eq!(at, raw.len());
        }
        let mut at = 0;
        assert_eq!(varint(&[0x80], &mut at), None);
    }

    #[test]
    fn a_short_answer_is_partial() {
        assert_eq!(read(&[0; 5], 7), (vec![], 7, Stop::Partial));
        assert_eq!(read(&[], 7), (vec![], 7, Stop::End));
    }
}
