//! The digest of a familiar record's key, and the fingerprint of a decision id.
//!
//! `familiar_digest(tenant, account, source, device)` is BLAKE2b with a 16-byte output
//! (Python's `hashlib.blake2b(data, digest_size=16)`, not a truncation) of
//!
//! ```text
//! b"authpipe-familiar-v1\0" + part(tenant) + part(account) + part(source) + part(device)
//! part(None) = b"\xff\xff\xff\xff";  part(s) = len(b).to_bytes(4, "little") + b
//! b = s.encode("utf-8", "surrogatepass")
//! ```
//!
//! Length-prefixed parts make the encoding injective, so two keys share a digest only by
//! a BLAKE2b-128 collision: among n records the odds are about n^2 / 2^129 (3e-24 for
//! 30M, 1.5e-15 for 10^12).
//!
//! `id_fingerprint(decision_id)` is the little-endian integer of BLAKE2b with an 8-byte
//! output of `b"authpipe-decision-id-v1\0" + decision_id (UTF-8, surrogatepass)`: enough to
//! tell a stale lift from a newer record (a wrong match needs two ids of one key to share
//! 64 bits: about 2^-64 per pair).

pub const FAMILIAR_DOMAIN: &[u8] = b"authpipe-familiar-v1\0";
pub const ID_DOMAIN: &[u8] = b"authpipe-decision-id-v1\0";

fn part(state: &mut blake2b_simd::State, value: Option<&[u8]>) {
    match value {
        None => {
            state.update(&[0xff, 0xff, 0xff, 0xff]);
        }
        Some(bytes) => {
            state.update(&(bytes.len() as u32).to_le_bytes());
            state.update(bytes);
        }
    }
}

pub fn familiar_digest(
    tenant: &[u8],
    account: Option<&[u8]>,
    source: Option<&[u8]>,
    device: Option<&[u8]>,
) -> [u8; 16] {
    let mut state = blake2b_simd::Params::new().hash_length(16).to_state();
    state.update(FAMILIAR_DOMAIN);
    part(&mut state, Some(tenant));
    part(&mut state, account);
    part(&mut state, source);
    part(&mut state, device);
    let mut out = [0u8; 16];
    out.copy_from_slice(state.finalize().as_bytes());
    out
}

pub fn id_fingerprint(decision_id: &[u8]) -> u64 {
    let mut state = blake2b_simd::Params::new().hash_length(8).to_state();
    state.update(ID_DOMAIN);
    state.update(decision_id);
    u64::from_le_bytes(state.finalize().as_bytes().try_into().unwrap())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_are_unambiguous() {
        let a = familiar_digest(b"t", Some(b"ab"), None, Some(b"c"));
        let b = familiar_digest(b"t", Some(b"a"), None, Some(b"bc"));
        let c = familiar_digest(b"t", Some(b"ab"), Some(b"c"), None);
        assert_ne!(a, b);
        assert_ne!(a, c);
    }
}
