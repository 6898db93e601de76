//! The decisions topic's familiar exempts, read without Python (issue 45's cold load).
//!
//! `familiar_key` reads a Kafka key as `pipeline.core.keys.parse_wire_key` and
//! `pipeline.edge.decode.decode_key` do, for the `familiar` scope only; `familiar_exempt`
//! reads a value as `pipeline.contracts.codec.decode_decision` does, for the one shape the
//! compiled store holds: `scope` and `rule` `familiar`, `action` `exempt`, no `challenge`.
//! Both accept a strict subset of what the Python readers accept, with the same result;
//! for anything else they answer `None` and the caller hands the message back to Python,
//! which applies it or reports it exactly as before. Never accepted here, though Python
//! may accept some: escapes in any string (field names too), numbers other than integers
//! of at most 20 digits, arrays and objects as values, a known field given twice, a
//! negative count, times not written as the worker writes them
//! (`2026-12-07T00:00:00.123Z`).

pub struct FamiliarKey<'a> {
    pub tenant: &'a [u8],
    pub account: Option<&'a [u8]>,
    pub source: Option<&'a [u8]>,
    pub device: Option<&'a [u8]>,
}

/// A `familiar|<tenant>|<account>|<source>|<device>` key (`-` or nothing: none) whose
/// tenant passes the tenant validator (`[a-z0-9][a-z0-9._-]{0,63}`); None for any other
/// key (another scope, bad UTF-8, a bad tenant, not five parts).
pub fn familiar_key(raw: &[u8]) -> Option<FamiliarKey<'_>> {
    std::str::from_utf8(raw).ok()?;
    let mut parts = raw.split(|&b| b == b'|');
    let scope = parts.next()?;
    let tenant = parts.next()?;
    let account = parts.next()?;
    let source = parts.next()?;
    let device = parts.next()?;
    if parts.next().is_some() || scope != b"familiar" || !valid_tenant(tenant) {
        return None;
    }
    Some(FamiliarKey {
        tenant,
        account: present(account),
        source: present(source),
        device: present(device),
    })
}

/// A key part: `-` is none (`parse_key`), and so is an empty part (`decode_key` keeps no
/// empty string).
fn present(part: &[u8]) -> Option<&[u8]> {
    if part.is_empty() || part == b"-" {
        None
    } else {
        Some(part)
    }
}

fn valid_tenant(t: &[u8]) -> bool {
    let first = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    !t.is_empty()
        && t.len() <= 64
        && first(t[0])
        && t[1..]
            .iter()
            .all(|&b| first(b) || b == b'.' || b == b'_' || b == b'-')
}

/// What the store keeps of a familiar exempt, and its decision id's UTF-8.
pub struct Exempt<'a> {
    pub decision_id: &'a [u8],
    pub issued_ms: i64,
    pub expires_ms: i64,
}

#[derive(Clone, Copy, PartialEq)]
enum Json<'a> {
    Null,
    Bool,
    Str(&'a [u8]),
    /// An integer: its sign (true: negative) and magnitude.
    Int(bool, u128),
}

const OPERATOR_MAX_CHARS: usize = 128;
const REASON_MAX_CHARS: usize = 512;
const APPLIES_TO: [&[u8]; 5] = [b"untrusted", b"device", b"uia", b"mfa", b"all"];

#[derive(Default)]
struct Fields<'a> {
    decision_id: Option<Json<'a>>,
    key: Option<Json<'a>>,
    tenant: Option<Json<'a>>,
    scope: Option<Json<'a>>,
    account_digest: Option<Json<'a>>,
    source: Option<Json<'a>>,
    device_id: Option<Json<'a>>,
    applies_to: Option<Json<'a>>,
    action: Option<Json<'a>>,
    rule: Option<Json<'a>>,
    count: Option<Json<'a>>,
    threshold: Option<Json<'a>>,
    window_ms: Option<Json<'a>>,
    issued_at: Option<Json<'a>>,
    expires_at: Option<Json<'a>>,
    policy_version: Option<Json<'a>>,
    operator: Option<Json<'a>>,
    reason: Option<Json<'a>>,
    challenge: Option<Json<'a>>,
}

impl<'a> Fields<'a> {
    /// The slot of a known field (None: an unknown field, ignored as Python ignores it).
    fn slot(&mut self, name: &[u8]) -> Option<&mut Option<Json<'a>>> {
        // By length and first byte: one comparison of the name, not up to nineteen.
        let (known, slot): (&[u8], _) = match (name.len(), name.first()) {
            (3, _) => (b"key", &mut self.key),
            (4, _) => (b"rule", &mut self.rule),
            (5, Some(b's')) => (b"scope", &mut self.scope),
            (5, _) => (b"count", &mut self.count),
            (6, Some(b't')) => (b"tenant", &mut self.tenant),
            (6, Some(b's')) => (b"source", &mut self.source),
            (6, Some(b'a')) => (b"action", &mut self.action),
            (6, _) => (b"reason", &mut self.reason),
            (8, _) => (b"operator", &mut self.operator),
            (9, Some(b'd')) => (b"device_id", &mut self.device_id),
            (9, Some(b't')) => (b"threshold", &mut self.threshold),
            (9, Some(b'w')) => (b"window_ms", &mut self.window_ms),
            (9, Some(b'i')) => (b"issued_at", &mut self.issued_at),
            (9, _) => (b"challenge", &mut self.challenge),
            (10, Some(b'a')) => (b"applies_to", &mut self.applies_to),
            (10, _) => (b"expires_at", &mut self.expires_at),
            (11, _) => (b"decision_id", &mut self.decision_id),
            (14, Some(b'a')) => (b"account_digest", &mut self.account_digest),
            (14, _) => (b"policy_version", &mut self.policy_version),
            _ => return None,
        };
        (name == known).then_some(slot)
    }
}

const ONES: u64 = 0x0101_0101_0101_0101;
const HIGHS: u64 = 0x8080_8080_8080_8080;

/// True when some byte of `word` may be `"`, `\\`, below 0x20 or above 0x7f (the
/// zero-byte test can flag a byte after a true match, never miss one).
#[inline]
fn special(word: u64) -> bool {
    let zero = |w: u64| w.wrapping_sub(ONES) & !w & HIGHS;
    let quote = zero(word ^ (ONES * u64::from(b'"')));
    let backslash = zero(word ^ (ONES * u64::from(b'\\')));
    let control = word.wrapping_sub(ONES * 0x20) & !word & HIGHS;
    (quote | backslash | control | (word & HIGHS)) != 0
}

struct Reader<'a> {
    raw: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn peek(&self) -> Option<u8> {
        self.raw.get(self.at).copied()
    }

    fn skip_ws(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.at += 1;
        }
    }

    fn eat(&mut self, byte: u8) -> Option<()> {
        if self.peek() == Some(byte) {
            self.at += 1;
            Some(())
        } else {
            None
        }
    }

    /// A string without escapes or control characters, valid UTF-8 (after its `"`): one
    /// pass over ASCII, UTF-8 checked only when a byte is not ASCII.
    fn string(&mut self) -> Option<&'a [u8]> {
        self.eat(b'"')?;
        let start = self.at;
        let rest = &self.raw[start..];
        let mut ascii = true;
        let mut len = 0;
        // Eight bytes at a time while none is special (a quote, a backslash, a control
        // character or a byte of a multi-byte character); the byte loop does the rest.
        while let Some(word) = rest.get(len..len + 8) {
            if special(u64::from_le_bytes(word.try_into().unwrap_or_default())) {
                break;
            }
            len += 8;
        }
        loop {
            let b = *rest.get(len)?;
            if b == b'"' {
                break;
            }
            if b == b'\\' || b < 0x20 {
                return None;
            }
            ascii &= b < 0x80;
            len += 1;
        }
        let text = &rest[..len];
        if !ascii {
            std::str::from_utf8(text).ok()?;
        }
        self.at = start + len + 1;
        Some(text)
    }

    fn literal(&mut self, word: &[u8], value: Json<'a>) -> Option<Json<'a>> {
        if self.raw[self.at..].starts_with(word) {
            self.at += word.len();
            Some(value)
        } else {
            None
        }
    }

    /// An integer of at most 20 digits (no fraction or exponent: those are refused).
    fn integer(&mut self) -> Option<Json<'a>> {
        let negative = self.eat(b'-').is_some();
        let start = self.at;
        while matches!(self.peek(), Some(b'0'..=b'9')) {
            self.at += 1;
        }
        let digits = &self.raw[start..self.at];
        if digits.is_empty() || digits.len() > 20 || (digits[0] == b'0' && digits.len() > 1) {
            return None;
        }
        if matches!(self.peek(), Some(b'.' | b'e' | b'E')) {
            return None;
        }
        let magnitude = digits
            .iter()
            .fold(0u128, |n, &d| n * 10 + u128::from(d - b'0'));
        Some(Json::Int(negative, magnitude))
    }

    fn value(&mut self) -> Option<Json<'a>> {
        match self.peek()? {
            b'"' => self.string().map(Json::Str),
            b'n' => self.literal(b"null", Json::Null),
            b't' => self.literal(b"true", Json::Bool),
            b'f' => self.literal(b"false", Json::Bool),
            b'-' | b'0'..=b'9' => self.integer(),
            _ => None,
        }
    }

    /// The top-level object's fields (a known field twice: None).
    fn object(&mut self) -> Option<Fields<'a>> {
        let mut fields = Fields::default();
        self.skip_ws();
        self.eat(b'{')?;
        self.skip_ws();
        if self.eat(b'}').is_none() {
            loop {
                self.skip_ws();
                let name = self.string()?;
                self.skip_ws();
                self.eat(b':')?;
                self.skip_ws();
                let value = self.value()?;
                if let Some(slot) = fields.slot(name) {
                    if slot.is_some() {
                        return None;
                    }
                    *slot = Some(value);
                }
                self.skip_ws();
                if self.eat(b',').is_some() {
                    continue;
                }
                self.eat(b'}')?;
                break;
            }
        }
        self.skip_ws();
        if self.at != self.raw.len() {
            return None;
        }
        Some(fields)
    }
}

fn text<'a>(field: Option<Json<'a>>) -> Option<&'a [u8]> {
    match field {
        Some(Json::Str(s)) => Some(s),
        _ => None,
    }
}

fn nonempty<'a>(field: Option<Json<'a>>) -> Option<&'a [u8]> {
    text(field).filter(|s| !s.is_empty())
}

/// None or absent (Python's `get` gives None for both), or a string of at most
/// `max_chars` code points.
fn nullable_text(field: Option<Json<'_>>, max_chars: usize) -> bool {
    match field {
        None | Some(Json::Null) => true,
        Some(Json::Str(s)) => {
            max_chars == usize::MAX
                || std::str::from_utf8(s).is_ok_and(|t| t.chars().count() <= max_chars)
        }
        _ => false,
    }
}

fn count_within(field: Option<Json<'_>>, high: u128) -> bool {
    matches!(field, Some(Json::Int(false, n)) if n <= high)
}

/// A familiar exempt's value for the Kafka key `wire_key`, or None when it is not one this
/// reader accepts (see the module's documentation).
pub fn familiar_exempt<'a>(raw: &'a [u8], wire_key: &[u8]) -> Option<Exempt<'a>> {
    let f = Reader { raw, at: 0 }.object()?;
    if text(f.key)? != wire_key
        || nonempty(f.tenant).is_none()
        || text(f.scope)? != b"familiar"
        || text(f.rule)? != b"familiar"
        || text(f.action)? != b"exempt"
        || !APPLIES_TO.contains(&text(f.applies_to)?)
        || text(f.policy_version).is_none()
        || !nullable_text(f.account_digest, usize::MAX)
        || !nullable_text(f.source, usize::MAX)
        || !nullable_text(f.device_id, usize::MAX)
        || !nullable_text(f.operator, OPERATOR_MAX_CHARS)
        || !nullable_text(f.reason, REASON_MAX_CHARS)
        || !count_within(f.count, u128::from(u32::MAX))
        || !count_within(f.threshold, u128::from(u32::MAX))
        || !count_within(f.window_ms, u128::from(u64::MAX))
        || !matches!(f.challenge, None | Some(Json::Null))
    {
        return None;
    }
    Some(Exempt {
        decision_id: nonempty(f.decision_id)?,
        issued_ms: utc_ms(text(f.issued_at)?)?,
        expires_ms: utc_ms(text(f.expires_at)?)?,
    })
}

fn digits(raw: &[u8]) -> Option<i64> {
    raw.iter().try_fold(0i64, |n, &d| {
        d.is_ascii_digit().then(|| n * 10 + i64::from(d - b'0'))
    })
}

/// `YYYY-MM-DDTHH:MM:SS.mmmZ` (the worker's `format_utc_ms`) as epoch milliseconds: a
/// real date of years 1 to 9999, hours to 23, seconds to 59 (what `fromisoformat` takes).
pub fn utc_ms(raw: &[u8]) -> Option<i64> {
    if raw.len() != 24
        || raw[4] != b'-'
        || raw[7] != b'-'
        || raw[10] != b'T'
        || raw[13] != b':'
        || raw[16] != b':'
        || raw[19] != b'.'
        || raw[23] != b'Z'
    {
        return None;
    }
    let (year, month, day) = (
        digits(&raw[0..4])?,
        digits(&raw[5..7])?,
        digits(&raw[8..10])?,
    );
    let (hour, minute, second) = (
        digits(&raw[11..13])?,
        digits(&raw[14..16])?,
        digits(&raw[17..19])?,
    );
    let milli = digits(&raw[20..23])?;
    let leap = year % 4 == 0 && (year % 100 != 0 || year % 400 == 0);
    let month_days = match month {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if leap => 29,
        2 => 28,
        _ => return None,
    };
    if year < 1 || day < 1 || day > month_days || hour > 23 || minute > 59 || second > 59 {
        return None;
    }
    let days = days_from_civil(year, month, day);
    Some((((days * 24 + hour) * 60 + minute) * 60 + second) * 1000 + milli)
}

/// Days from 1970-01-01 to a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_are_read_whole_and_escapes_refused() {
        for text in [
            &b"a"[..],
            b"0123456789abcdef0123",
            b"\xc3\xa9tait 8 bytes+",
            b"",
        ] {
            let mut raw = vec![b'"'];
            raw.extend_from_slice(text);
            raw.extend_from_slice(b"\"rest");
            let mut reader = Reader { raw: &raw, at: 0 };
            assert_eq!(reader.string(), Some(text));
            assert_eq!(reader.at, text.len() + 2);
        }
        for bad in [
            &b"\"01234567\\n\""[..],
            b"\"0123456789\x01\"",
            b"\"01234567\xff\"",
        ] {
            assert!(Reader { raw: bad, at: 0 }.string().is_none());
        }
        assert!(!special(u64::from_le_bytes(*b"abcdef01")));
        for word in [*b"abc\"ef01", *b"abcdef0\\", *b"\tbcdef01", *b"abcdef0\x80"] {
            assert!(special(u64::from_le_bytes(word)));
        }
    }

    #[test]
    fn times_are_epoch_ms() {
        assert_eq!(utc_ms(b"1970-01-01T00:00:00.000Z"), Some(0));
        assert_eq!(utc_ms(b"2026-12-07T00:00:00.123Z"), Some(1_796_601_600_123));
        assert_eq!(
            utc_ms(b"0001-01-01T00:00:00.000Z"),
            Some(-62_135_596_800_000)
        );
        assert_eq!(utc_ms(b"2024-02-29T23:59:59.999Z"), Some(1_709_251_199_999));
        assert_eq!(utc_ms(b"2023-02-29T00:00:00.000Z"), None);
        assert_eq!(utc_ms(b"2026-12-07T24:00:00.000Z"), None);
        assert_eq!(utc_ms(b"2026-12-07T00:00:00.000+00:00"), None);
    }

    #[test]
    fn keys_are_familiar_only() {
        let k = familiar_key(b"familiar|acme|ab||-").unwrap();
        assert_eq!(
            (k.tenant, k.account, k.source, k.device),
            (&b"acme"[..], Some(&b"ab"[..]), None, None)
        );
        assert!(familiar_key(b"source|acme|-|1.2.3.4|-").is_none());
        assert!(familiar_key(b"familiar|Acme|a|s|-").is_none());
        assert!(familiar_key(b"familiar|acme|a|s|-|x").is_none());
    }
}
