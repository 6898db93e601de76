//! authpipe's compiled engine (issue 45), as the Python module `authpipe_engine`.
//!
//! The first piece: `FamiliarStore`, the edge's familiar exempts as fixed-size records
//! (`table.rs`) keyed by `familiar_digest` (`digest.rs`), with no Python object per record,
//! filled from the decisions topic's JSON (`decode.rs`) or straight from a fetch answer's
//! record batches (`batch.rs`); and `partition_slots`, Kafka's default partitioner for the worker's decisions
//! (`partition.rs`).

mod batch;
mod decode;
mod digest;
mod partition;
mod table;

use std::borrow::Cow;

use pyo3::exceptions::{PyMemoryError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes, PyList, PyString};
use std::collections::HashSet;

use table::{Digest, Table, Value, KEY_BYTES, MAX_RECORDS, RECORD_BYTES};

fn no_memory(records: usize) -> PyErr {
    PyMemoryError::new_err(format!(
        "no memory for a familiar store of {records} records (about {} MB)",
        (table::slots_for(records) * 41) >> 20
    ))
}

fn records_bound(name: &str, records: usize) -> PyResult<usize> {
    if records > MAX_RECORDS {
        return Err(PyValueError::new_err(format!(
            "{name} is at most {MAX_RECORDS} records (a store that size is about 100 GB); got {records}"
        )));
    }
    Ok(records)
}

fn utf8<'a>(s: &'a Bound<'_, PyString>) -> PyResult<Cow<'a, [u8]>> {
    match s.to_str() {
        Ok(text) => Ok(Cow::Borrowed(text.as_bytes())),
        // A lone surrogate has no UTF-8: encoded as the digester encodes it.
        Err(_) => {
            let raw = s.call_method1("encode", ("utf-8", "surrogatepass"))?;
            Ok(Cow::Owned(raw.cast_into::<PyBytes>()?.as_bytes().to_vec()))
        }
    }
}

fn opt_utf8<'a>(s: &'a Option<Bound<'_, PyString>>) -> PyResult<Option<Cow<'a, [u8]>>> {
    s.as_ref().map(utf8).transpose()
}

fn digest_of(raw: &[u8]) -> PyResult<Digest> {
    raw.try_into().map_err(|_| {
        PyValueError::new_err(format!(
            "a familiar digest is {KEY_BYTES} bytes (authpipe_engine.familiar_digest), got {}",
            raw.len()
        ))
    })
}

fn time_ms(name: &str, value: i64) -> PyResult<i64> {
    if value < 0 {
        return Err(PyValueError::new_err(format!(
            "{name} must be epoch milliseconds, at least 0; got {value}"
        )));
    }
    Ok(value)
}

fn since_ms(value: i64) -> PyResult<i64> {
    if value < -1 {
        return Err(PyValueError::new_err(format!(
            "since_ms must be epoch milliseconds, or -1 for unknown; got {value}"
        )));
    }
    Ok(value)
}

/// The 16-byte digest of a familiar record's key (see `digest.rs` for the encoding).
#[pyfunction]
#[pyo3(signature = (tenant, account, source, device))]
fn familiar_digest<'py>(
    py: Python<'py>,
    tenant: Bound<'py, PyString>,
    account: Option<Bound<'py, PyString>>,
    source: Option<Bound<'py, PyString>>,
    device: Option<Bound<'py, PyString>>,
) -> PyResult<Bound<'py, PyBytes>> {
    let d = key_digest(&tenant, &account, &source, &device)?;
    Ok(PyBytes::new(py, &d))
}

fn key_digest(
    tenant: &Bound<'_, PyString>,
    account: &Option<Bound<'_, PyString>>,
    source: &Option<Bound<'_, PyString>>,
    device: &Option<Bound<'_, PyString>>,
) -> PyResult<Digest> {
    let t = utf8(tenant)?;
    let (a, s, d) = (opt_utf8(account)?, opt_utf8(source)?, opt_utf8(device)?);
    Ok(digest::familiar_digest(
        &t,
        a.as_deref(),
        s.as_deref(),
        d.as_deref(),
    ))
}

/// The 64-bit fingerprint of a decision id (see `digest.rs`).
#[pyfunction]
fn id_fingerprint(decision_id: Bound<'_, PyString>) -> PyResult<u64> {
    Ok(digest::id_fingerprint(&utf8(&decision_id)?))
}

/// Familiar exempts by digest: expiry, evidence start and decision-id fingerprint, in
/// about 48 bytes per record (40 a slot, at most 85 % of slots full).
#[pyclass(module = "authpipe_engine")]
struct FamiliarStore {
    table: Table,
}

/// What ``put_encoded`` did: the indexes it handed back, then how many exempts it put,
/// tombstones it applied, expired exempts it dropped, records it changed (put, or removed
/// by a tombstone or an expired exempt), and the tenants of the exempts it put.
type Encoded<'py> = (
    Vec<usize>,
    usize,
    usize,
    usize,
    usize,
    Vec<Bound<'py, PyString>>,
);

/// What ``put_batches`` did: ``put_encoded``'s counts with the handed-back messages
/// themselves, then the offset to read next, the records read and whether a batch was
/// left unread.
type Batches<'py> = (
    Vec<(Option<Bound<'py, PyBytes>>, Option<Bound<'py, PyBytes>>)>,
    usize,
    usize,
    usize,
    usize,
    Vec<Bound<'py, PyString>>,
    i64,
    usize,
    bool,
);

/// The counts of one ``put_encoded`` or ``put_batches`` call, and the keys handed back.
#[derive(Default)]
struct Tally {
    put: usize,
    lifted: usize,
    expired: usize,
    changed: usize,
    tenants: Vec<Vec<u8>>,
    back_keys: HashSet<Digest>,
}

impl Tally {
    /// Hand back the later messages of ``raw_key`` too, if it is a familiar key.
    fn hand_back(&mut self, raw_key: &[u8]) {
        if let Some(k) = decode::familiar_key(raw_key) {
            self.back_keys.insert(digest::familiar_digest(
                k.tenant, k.account, k.source, k.device,
            ));
        }
    }

    /// The counts, and the tenants as Python strings.
    #[allow(clippy::type_complexity)]
    fn finish<'py>(
        &self,
        py: Python<'py>,
    ) -> (usize, usize, usize, usize, Vec<Bound<'py, PyString>>) {
        let tenants = self
            .tenants
            .iter()
            .map(|t| PyString::new(py, std::str::from_utf8(t).unwrap_or_default()))
            .collect();
        (self.put, self.lifted, self.expired, self.changed, tenants)
    }
}

impl FamiliarStore {
    /// Apply one message (``value`` None: a tombstone) if it is a familiar exempt or a
    /// tombstone on a familiar key that is not handed back already; false: the caller's.
    fn take(
        &mut self,
        raw_key: &[u8],
        value: Option<&[u8]>,
        now: i64,
        held: Option<&Table>,
        tally: &mut Tally,
    ) -> PyResult<bool> {
        let Some(k) = decode::familiar_key(raw_key) else {
            return Ok(false);
        };
        let digest = digest::familiar_digest(k.tenant, k.account, k.source, k.device);
        if tally.back_keys.contains(&digest) || held.is_some_and(|h| h.get(&digest).is_some()) {
            tally.back_keys.insert(digest);
            return Ok(false);
        }
        let Some(value) = value else {
            tally.lifted += 1;
            if self.table.lift(&digest, None).is_some() {
                tally.changed += 1;
            }
            return Ok(true);
        };
        let Some(exempt) = decode::familiar_exempt(value, raw_key) else {
            tally.back_keys.insert(digest);
            return Ok(false);
        };
        if exempt.expires_ms <= now {
            tally.expired += 1;
            if self.table.lift(&digest, None).is_some() {
                tally.changed += 1;
            }
            return Ok(true);
        }
        // A familiar pair is familiar from its issue (``evidence_since_ms``); an evidence
        // start before -1 is the dict's to hold.
        if exempt.issued_ms < -1 {
            tally.back_keys.insert(digest);
            return Ok(false);
        }
        let record = Value {
            expires_ms: exempt.expires_ms,
            since_ms: exempt.issued_ms,
            id_fp: digest::id_fingerprint(exempt.decision_id),
        };
        let records = self.table.len() + 1;
        self.table
            .put(digest, record)
            .map_err(|_| no_memory(records))?;
        tally.put += 1;
        tally.changed += 1;
        if !tally.tenants.iter().any(|t| t.as_slice() == k.tenant) {
            tally.tenants.push(k.tenant.to_vec());
        }
        Ok(true)
    }
}

fn value_tuple(v: Value) -> (i64, i64, u64) {
    (v.expires_ms, v.since_ms, v.id_fp)
}

#[pymethods]
impl FamiliarStore {
    #[new]
    #[pyo3(signature = (capacity = 0))]
    fn new(capacity: usize) -> PyResult<Self> {
        let records = records_bound("capacity", capacity)?;
        let table = Table::with_capacity(records).map_err(|_| no_memory(records))?;
        Ok(FamiliarStore { table })
    }

    /// Insert or replace ``digest``'s record (the last one put wins, expired or not).
    #[pyo3(signature = (digest, expires_ms, since_ms = -1, id_fp = 0))]
    fn put(&mut self, digest: &[u8], expires_ms: i64, since_ms: i64, id_fp: u64) -> PyResult<()> {
        let key = digest_of(digest)?;
        let value = Value {
            expires_ms: time_ms("expires_ms", expires_ms)?,
            since_ms: self::since_ms(since_ms)?,
            id_fp,
        };
        let records = self.table.len() + 1;
        self.table.put(key, value).map_err(|_| no_memory(records))
    }

    /// Put every record of ``packed`` (``RECORD_BYTES`` each, ``RECORD_FORMAT``) in order;
    /// returns how many. Checked whole first: a bad record puts nothing.
    fn put_many(&mut self, py: Python<'_>, packed: &[u8]) -> PyResult<usize> {
        if packed.len() % RECORD_BYTES != 0 {
            return Err(PyValueError::new_err(format!(
                "packed records are {RECORD_BYTES} bytes each (RECORD_FORMAT); got {} bytes, \
                 not a multiple",
                packed.len()
            )));
        }
        for (n, record) in packed.chunks_exact(RECORD_BYTES).enumerate() {
            let (_, v) = table::unpack(record);
            if v.expires_ms < 0 || v.since_ms < -1 {
                return Err(PyValueError::new_err(format!(
                    "packed record {n}: expires_ms must be at least 0 and since_ms at least \
                     -1; got {} and {}",
                    v.expires_ms, v.since_ms
                )));
            }
        }
        let count = packed.len() / RECORD_BYTES;
        let records = records_bound("a store with put_many's records", self.table.len() + count)?;
        let table = &mut self.table;
        py.detach(|| {
            table.reserve(count)?;
            for record in packed.chunks_exact(RECORD_BYTES) {
                let (k, v) = table::unpack(record);
                table.put(k, v)?; // never grows: reserved above
            }
            Ok(())
        })
        .map_err(|_: std::collections::TryReserveError| no_memory(records))?;
        Ok(count)
    }

    /// Apply the decisions topic's messages (``keys[i]``, ``values[i]``: bytes, a value of
    /// None a tombstone) in order, as ``DecisionView.apply`` does at ``now_ms``, for those
    /// that are familiar exempts or tombstones on a familiar key (``decode.rs`` reads them
    /// as the Python decoders do, a strict subset); every other message is handed back, its
    /// index in the first list returned, for the caller to apply after this call. So that
    /// each key's messages still apply in order, once one message of a key is handed back
    /// so are the later ones of that key in the batch, and every message of a key in
    /// ``held`` (a store used as a set: the keys whose decision the caller holds elsewhere).
    /// Returns ``(handed_back, put, lifted, expired, changed, tenants)`` (``Encoded``).
    #[pyo3(signature = (keys, values, now_ms, held = None))]
    fn put_encoded<'py>(
        &mut self,
        py: Python<'py>,
        keys: &Bound<'py, PyList>,
        values: &Bound<'py, PyList>,
        now_ms: i64,
        held: Option<PyRef<'py, FamiliarStore>>,
    ) -> PyResult<Encoded<'py>> {
        let now = time_ms("now_ms", now_ms)?;
        if keys.len() != values.len() {
            return Err(PyValueError::new_err(format!(
                "put_encoded takes as many values as keys; got {} keys and {} values",
                keys.len(),
                values.len()
            )));
        }
        let held = held.as_ref().map(|h| &h.table);
        let mut back: Vec<usize> = Vec::new();
        let mut tally = Tally::default();
        for (i, (key, value)) in keys.iter().zip(values.iter()).enumerate() {
            let Ok(key) = key.cast::<PyBytes>() else {
                back.push(i);
                continue;
            };
            let value = if value.is_none() {
                None
            } else if let Ok(v) = value.cast::<PyBytes>() {
                Some(v.as_bytes())
            } else {
                // not bytes: the Python path reports it (its key's later messages follow)
                tally.hand_back(key.as_bytes());
                back.push(i);
                continue;
            };
            if !self.take(key.as_bytes(), value, now, held, &mut tally)? {
                back.push(i);
            }
        }
        let (put, lifted, expired, changed, tenants) = tally.finish(py);
        Ok((back, put, lifted, expired, changed, tenants))
    }

    /// Apply a fetch answer's record batches (``raw``: the partition's records as the
    /// broker sent them, ``batch.rs``) from ``from_offset`` as ``put_encoded`` applies the
    /// same messages: familiar exempts and their tombstones here, every other message
    /// handed back as ``(key, value)`` (bytes or None) in order. The batches are read up
    /// to the end, to a batch cut short, or to one this reader does not take (another
    /// format, a compression codec, a bad CRC): ``unread`` then says so, and ``next`` is
    /// that batch's first offset, for a consumer to read from. Returns ``(handed_back,
    /// put, lifted, expired, changed, tenants, next, records, unread)``.
    ///
    /// ``raw`` is bytes, or a bytearray (a connection's own answer buffer) of which
    /// ``raw[start:end]`` are the batches; nothing may resize it during the call.
    #[pyo3(signature = (raw, from_offset, now_ms, held = None, start = 0, end = None))]
    #[allow(clippy::too_many_arguments)]
    fn put_batches<'py>(
        &mut self,
        py: Python<'py>,
        raw: &Bound<'py, PyAny>,
        from_offset: i64,
        now_ms: i64,
        held: Option<PyRef<'py, FamiliarStore>>,
        start: usize,
        end: Option<usize>,
    ) -> PyResult<Batches<'py>> {
        let now = time_ms("now_ms", now_ms)?;
        let held = held.as_ref().map(|h| &h.table);
        let whole: &[u8] = if let Ok(b) = raw.cast::<PyBytes>() {
            b.as_bytes()
        } else if let Ok(b) = raw.cast::<PyByteArray>() {
            // SAFETY: the GIL is held for the whole call and nothing here runs Python code
            // that could resize the bytearray: only new bytes objects are made (a collection
            // they set off could run a finalizer, and no finalizer holds the caller's
            // answer buffer).
            unsafe { b.as_bytes() }
        } else {
            return Err(PyTypeError::new_err(
                "put_batches reads bytes or a bytearray of record batches",
            ));
        };
        let end = end.unwrap_or(whole.len());
        let Some(raw) = whole.get(start..end) else {
            return Err(PyValueError::new_err(format!(
                "put_batches: [{start}:{end}] is not within the {} bytes given",
                whole.len()
            )));
        };
        let (records, next, stop) = batch::read(raw, from_offset);
        let mut back: Vec<(Option<Bound<'py, PyBytes>>, Option<Bound<'py, PyBytes>>)> = Vec::new();
        let mut tally = Tally::default();
        for r in &records {
            let taken = match r.key {
                Some(key) => self.take(key, r.value, now, held, &mut tally)?,
                None => false,
            };
            if !taken {
                back.push((
                    r.key.map(|k| PyBytes::new(py, k)),
                    r.value.map(|v| PyBytes::new(py, v)),
                ));
            }
        }
        let (put, lifted, expired, changed, tenants) = tally.finish(py);
        let unread = stop == batch::Stop::Unread;
        Ok((
            back,
            put,
            lifted,
            expired,
            changed,
            tenants,
            next,
            records.len(),
            unread,
        ))
    }

    /// Remove ``digest``'s record, only if its fingerprint is ``id_fp`` when one is given
    /// (a stale lift leaves a newer record); True when one was removed.
    #[pyo3(signature = (digest, id_fp = None))]
    fn lift(&mut self, digest: &[u8], id_fp: Option<u64>) -> PyResult<bool> {
        Ok(self.table.lift(&digest_of(digest)?, id_fp).is_some())
    }

    /// ``(expires_ms, since_ms, id_fp)`` of ``digest``'s record, expired or not, or None.
    fn get(&self, digest: &[u8]) -> PyResult<Option<(i64, i64, u64)>> {
        Ok(self.table.get(&digest_of(digest)?).map(value_tuple))
    }

    /// The expiry of ``digest``'s record, or None.
    fn expiry(&self, digest: &[u8]) -> PyResult<Option<i64>> {
        Ok(self.table.get(&digest_of(digest)?).map(|v| v.expires_ms))
    }

    /// True when ``digest`` has a record alive at ``now_ms`` (its expiry after it).
    fn contains_at(&self, digest: &[u8], now_ms: i64) -> PyResult<bool> {
        let now = time_ms("now_ms", now_ms)?;
        Ok(matches!(self.table.get(&digest_of(digest)?), Some(v) if v.expires_ms > now))
    }

    /// ``contains_at`` of the key's digest (``familiar_digest``), without a bytes object.
    #[pyo3(signature = (tenant, account, source, device, now_ms))]
    fn familiar_at(
        &self,
        tenant: Bound<'_, PyString>,
        account: Option<Bound<'_, PyString>>,
        source: Option<Bound<'_, PyString>>,
        device: Option<Bound<'_, PyString>>,
        now_ms: i64,
    ) -> PyResult<bool> {
        let now = time_ms("now_ms", now_ms)?;
        let key = key_digest(&tenant, &account, &source, &device)?;
        Ok(matches!(self.table.get(&key), Some(v) if v.expires_ms > now))
    }

    /// ``get`` of the key's digest (``familiar_digest``).
    #[pyo3(signature = (tenant, account, source, device))]
    fn get_key(
        &self,
        tenant: Bound<'_, PyString>,
        account: Option<Bound<'_, PyString>>,
        source: Option<Bound<'_, PyString>>,
        device: Option<Bound<'_, PyString>>,
    ) -> PyResult<Option<(i64, i64, u64)>> {
        let key = key_digest(&tenant, &account, &source, &device)?;
        Ok(self.table.get(&key).map(value_tuple))
    }

    /// Remove every record expired at ``now_ms`` (expiry at or before it); returns how
    /// many. Scans every slot: see ``prune_step`` for a bounded step.
    fn prune(&mut self, py: Python<'_>, now_ms: i64) -> PyResult<usize> {
        let now = time_ms("now_ms", now_ms)?;
        let table = &mut self.table;
        Ok(py.detach(|| table.prune(now, &mut |_| {})))
    }

    /// ``prune``, returning the removed records' digests.
    fn prune_keys<'py>(&mut self, py: Python<'py>, now_ms: i64) -> PyResult<Bound<'py, PyList>> {
        let now = time_ms("now_ms", now_ms)?;
        let mut removed: Vec<Digest> = Vec::new();
        self.table.prune(now, &mut |k| removed.push(*k));
        PyList::new(py, removed.iter().map(|k| PyBytes::new(py, k)))
    }

    /// Prune the next ``max_slots`` slots after the last step's (wrapping): a whole sweep
    /// takes ``slot_count / max_slots`` steps. Returns how many records were removed.
    fn prune_step(&mut self, now_ms: i64, max_slots: usize) -> PyResult<usize> {
        let now = time_ms("now_ms", now_ms)?;
        Ok(self.table.prune_step(now, max_slots))
    }

    /// Records alive at ``now_ms`` (a scan of every slot).
    fn count_alive(&self, now_ms: i64) -> PyResult<usize> {
        Ok(self.table.count_alive(time_ms("now_ms", now_ms)?))
    }

    /// Make room for ``more`` records beyond those held, so loading them never rehashes.
    fn reserve(&mut self, more: usize) -> PyResult<()> {
        let records = records_bound("reserve", self.table.len().saturating_add(more))?;
        self.table.reserve(more).map_err(|_| no_memory(records))
    }

    /// Every record as ``(digest, expires_ms, since_ms, id_fp)``, in slot order.
    fn items<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let mut out: Vec<(Bound<'py, PyBytes>, i64, i64, u64)> =
            Vec::with_capacity(self.table.len());
        self.table.for_each(&mut |k, v| {
            out.push((PyBytes::new(py, k), v.expires_ms, v.since_ms, v.id_fp))
        });
        PyList::new(py, out)
    }

    /// Bytes the store holds (slots, tags): its resident size once touched.
    fn approx_bytes(&self) -> usize {
        self.table.approx_bytes()
    }

    /// Slots allocated (records held at most 85 % of them).
    fn slot_count(&self) -> usize {
        self.table.slot_count()
    }

    fn __len__(&self) -> usize {
        self.table.len()
    }

    fn __repr__(&self) -> String {
        format!(
            "FamiliarStore(records={}, slots={}, bytes={})",
            self.table.len(),
            self.table.slot_count(),
            self.table.approx_bytes()
        )
    }
}

/// Each key's partition index among `partitions` as Kafka's default partitioner gives it
/// (`partition.rs`): one call for an envelope's decisions.
#[pyfunction]
fn partition_slots(keys: Vec<Bound<'_, PyBytes>>, partitions: u32) -> PyResult<Vec<u32>> {
    if partitions == 0 {
        return Err(PyValueError::new_err(
            "partitions must be at least 1: the topic's metadata names none yet",
        ));
    }
    Ok(keys
        .iter()
        .map(|key| partition::slot(key.as_bytes(), partitions))
        .collect())
}

#[pymodule]
fn authpipe_engine(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<FamiliarStore>()?;
    m.add_function(wrap_pyfunction!(familiar_digest, m)?)?;
    m.add_function(wrap_pyfunction!(id_fingerprint, m)?)?;
    m.add_function(wrap_pyfunction!(partition_slots, m)?)?;
    m.add("KEY_BYTES", KEY_BYTES)?;
    m.add("RECORD_BYTES", RECORD_BYTES)?;
    m.add("RECORD_FORMAT", "<16sqqQ")?;
    m.add(
        "FAMILIAR_DOMAIN",
        PyBytes::new(m.py(), digest::FAMILIAR_DOMAIN),
    )?;
    m.add("ID_DOMAIN", PyBytes::new(m.py(), digest::ID_DOMAIN))?;
    Ok(())
}
