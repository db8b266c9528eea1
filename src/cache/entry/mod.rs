//! A stored response: immutable once built, shared as `Arc<Entry>` by every hit.
//!
//! Everything a hit needs is prepared here at store time: for each stored encoding, the complete
//! header block to send (Content-Encoding, Content-Length, Vary and a weakened ETag included) and
//! the body as one `Bytes`. A hit clones the header block and the `Bytes` handle; it never parses
//! stored headers, compresses, or copies a body. A body of `cache.zero_copy_min` bytes or more is
//! copied once, here, into a memory file ([`crate::mapped`]), which a plain socket then sends
//! with `sendfile` (its bytes count in the entry's weight as before); an entry decoded from a
//! tier below, only once memory keeps it. Its bytes form, for tiers beyond memory, is in
//! [`super::record`].
//!
//! [`pending`]: the compressed variants of an entry on their way (entries hold it, it holds the
//! latest entry: the two types refer to each other, so it is a file of the entry's own).

pub mod pending;

use std::sync::Arc;
use std::time::SystemTime;

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::StatusCode;

use super::policy::Freshness;
use super::vary::Selection;
use crate::compress::Encoding;
use pending::Pending;

/// One encoding of a stored response, ready to write.
#[derive(Debug)]
pub struct Variant {
    /// Complete response header block for this encoding (Age and the cache-status header are
    /// added per hit).
    pub head: HeaderMap,
    pub body: Bytes,
}

/// A stored response.
#[derive(Debug)]
pub struct Entry {
    pub status: StatusCode,
    /// End-to-end headers as stored (without Content-Length/Content-Encoding), used to derive
    /// variants and to refresh on revalidation.
    pub headers: HeaderMap,
    variants: [Option<Variant>; 4],
    /// Stored encodings, smallest body first (the first `encodings` of them): a hit sends the
    /// first one the client accepts. Inline, so that choosing touches no other allocation (a
    /// cold cache line on every hit of a large cache).
    by_size: [Encoding; 4],
    encodings: u8,
    pub freshness: Freshness,
    /// Validators, read once at store time.
    pub etag: Option<HeaderValue>,
    pub last_modified: Option<SystemTime>,
    /// May answer requests carrying Authorization (public, s-maxage or must-revalidate; §3.5).
    pub auth_ok: bool,
    /// Whether larder negotiates the content coding (adds Vary: Accept-Encoding).
    pub negotiated: bool,
    /// Tags for purge by tag (from the configured tag header).
    pub tags: Box<[Box<str>]>,
    /// The requests this response answers (its Vary and the values that selected it, §4.1);
    /// empty for a response that does not vary.
    pub selection: Selection,
    /// Bytes this entry costs in the store.
    pub weight: u64,
    /// Set while compressed variants of this response are being built and published (a hit
    /// that would get identity may wait for one); None once the last is published.
    pub pending: Option<Arc<Pending>>,
    /// Lookups that found this entry (for the admin API's top keys). Counted without a locked
    /// instruction ([`Entry::count_hit`]): concurrent hits on two cores may lose a count, the
    /// hit path never waits on one.
    hits: std::sync::atomic::AtomicU64,
    /// The identity slot holds a body in a coding larder does not know (its Content-Encoding
    /// kept as the origin sent it).
    pub opaque: bool,
    /// The cache-status field name [`Entry::reserve_stamp`] made room for, kept by the
    /// entries derived from this one.
    stamp: Option<HeaderName>,
}

/// Headers an entry never stores: hop-by-hop fields and those larder recomputes.
const NOT_STORED: [HeaderName; 4] = [
    header::CONTENT_LENGTH,
    header::CONTENT_ENCODING,
    header::AGE,
    header::TRANSFER_ENCODING,
];

/// Heap bytes a field's entry takes in a `HeaderMap` besides its name and value (hash, links,
/// name, value: 104 bytes on 64-bit targets).
const FIELD_BYTES: u64 = 104;

/// Heap bytes `m` holds: its fields' entries, names and values (a value may share one
/// allocation with others: counted again for each map, which errs on the side of more), and
/// its index (4 bytes a slot, at most three quarters of the slots used).
fn map_bytes(m: &HeaderMap) -> u64 {
    let index = (m.capacity() as u64).div_ceil(3) * 4 * 4;
    m.iter()
        .map(|(k, v)| FIELD_BYTES + v.len() as u64 + k.as_str().len() as u64)
        .sum::<u64>()
        + index
}

/// Moves every field value of `headers` into one allocation of their own. Values parsed from
/// an origin's response are slices of the upstream connection's read buffer (hyper's, 8 KiB
/// or more), and a stored slice keeps all of it alive: about 8.5 KiB per small cached
/// response (185,000 entries of a 100-byte page held 1.5 GiB under a 256 MiB `max_size`).
/// One block also makes a hit's copy of the header block count one reference, not one per
/// buffer.
fn own_values(headers: &mut HeaderMap) {
    let total: usize = headers.values().map(|v| v.len()).sum();
    let mut block = Vec::with_capacity(total);
    for v in headers.values() {
        block.extend_from_slice(v.as_bytes());
    }
    let block = Bytes::from(block);
    let mut at = 0;
    for v in headers.values_mut() {
        let len = v.len();
        // The same bytes, which were a valid value already.
        if let Ok(mut owned) = HeaderValue::from_maybe_shared(block.slice(at..at + len)) {
            owned.set_sensitive(v.is_sensitive());
            *v = owned;
        }
        at += len;
    }
}

impl Entry {
    /// Builds an entry from stored headers and the bodies available per encoding.
    /// `compressible` adds `Vary: Accept-Encoding` (the body is negotiated by larder). Its
    /// large bodies go into memory files ([`crate::mapped::map`]).
    pub fn build(
        status: StatusCode,
        headers: HeaderMap,
        bodies: Vec<(Encoding, Bytes)>,
        freshness: Freshness,
        negotiated: bool,
    ) -> Entry {
        Entry::build_as(status, headers, bodies, freshness, negotiated, true)
    }

    /// [`Entry::build`], with the bodies put in memory files (`map`) or left where they are: a
    /// record read back from a tier below is decoded without, since most are sent once and
    /// dropped, and making a memory file costs far more than the copy into the socket it saves
    /// (about 430 µs a MiB against 20 for reading it; docs/design.md "Large bodies without a
    /// copy"). [`Entry::into_mapped`] maps them when the entry is kept in memory.
    pub(in crate::cache) fn build_as(
        status: StatusCode,
        mut headers: HeaderMap,
        bodies: Vec<(Encoding, Bytes)>,
        freshness: Freshness,
        negotiated: bool,
        map: bool,
    ) -> Entry {
        // A coding larder does not know stays on the stored headers: the body (in the identity
        // slot) is stored and served exactly as the origin coded it.
        let opaque = headers.get(header::CONTENT_ENCODING).is_some_and(|v| {
            v.to_str()
                .ok()
                .and_then(Encoding::from_content_encoding)
                .is_none()
        });
        for h in NOT_STORED {
            if !(opaque && h == header::CONTENT_ENCODING) {
                headers.remove(h);
            }
        }
        if negotiated && !vary_lists(&headers, "accept-encoding") {
            headers.append(header::VARY, HeaderValue::from_static("Accept-Encoding"));
        }
        own_values(&mut headers);
        let etag = headers.get(header::ETAG).cloned();
        let last_modified = headers
            .get(header::LAST_MODIFIED)
            .and_then(|v| v.to_str().ok())
            .and_then(crate::http::date::parse_lenient);

        let mut variants: [Option<Variant>; 4] = [None, None, None, None];
        let mut by_size: Vec<(usize, Encoding)> = Vec::with_capacity(bodies.len());
        for (enc, body) in bodies {
            // A large body goes into a memory file, which plain HTTP/1.1 sends without a copy.
            let body = if map { crate::mapped::map(body) } else { body };
            let mut head = headers.clone();
            if let Some(v) = enc.header_value() {
                head.insert(header::CONTENT_ENCODING, v);
                if let Some(weak) = etag.as_ref().and_then(crate::http::etag::weakened) {
                    head.insert(header::ETAG, weak);
                }
            }
            head.insert(header::CONTENT_LENGTH, HeaderValue::from(body.len()));
            by_size.push((body.len(), enc));
            // A clone's field list is exactly as long as it needs (the insertions grew it).
            variants[enc as usize] = Some(Variant {
                head: head.clone(),
                body,
            });
        }
        // Smallest first; on a tie prefer identity (no decoding work for the client).
        by_size.sort_by_key(|(len, e)| (*len, *e != Encoding::Identity));
        let mut order = [Encoding::Identity; 4];
        for (slot, (_, e)) in order.iter_mut().zip(&by_size) {
            *slot = *e;
        }
        let mut entry = Entry {
            status,
            headers: headers.clone(),
            variants,
            by_size: order,
            encodings: by_size.len().min(4) as u8,
            freshness,
            etag,
            last_modified,
            auth_ok: false,
            negotiated,
            tags: Box::new([]),
            selection: Selection::default(),
            weight: 0,
            pending: None,
            hits: std::sync::atomic::AtomicU64::new(0),
            opaque,
            stamp: None,
        };
        entry.recount();
        entry
    }

    /// This entry with its large bodies in memory files, as [`Entry::build`] makes them: for an
    /// entry decoded from a tier below ([`Entry::build_as`]) once it is kept in memory, where
    /// its hits repay the memory file. Same bytes, same weight.
    pub(in crate::cache) fn into_mapped(mut self) -> Entry {
        for v in self.variants.iter_mut().flatten() {
            v.body = crate::mapped::map(std::mem::take(&mut v.body));
        }
        self
    }

    /// Sets [`Entry::weight`] to the heap bytes the entry holds, which the cache's `max_size`
    /// bounds: the entry itself, its header maps (stored and one per variant: a field takes
    /// [`FIELD_BYTES`] beside its name and value), its bodies and tags. Called once it is
    /// built, and again by whoever changes what it holds.
    pub fn recount(&mut self) {
        let mut bytes = std::mem::size_of::<Entry>() as u64 + map_bytes(&self.headers);
        for v in self.variants.iter().flatten() {
            bytes += map_bytes(&v.head) + v.body.len() as u64;
        }
        bytes += self.tags.iter().map(|t| t.len() as u64 + 16).sum::<u64>();
        self.weight = bytes;
    }

    /// Makes room in every variant's header block for the two fields a cached delivery adds
    /// ([`crate::deliver::from_entry`]: Age and the cache-status field `status`), so that a
    /// hit's copy of the block never grows: a `HeaderMap` clone has no spare capacity, and
    /// the first field inserted into it reallocates and moves every field (about 650
    /// instructions of a 15,000-instruction hit). The fields hold placeholders that every
    /// delivery replaces in place. Only for entries that are always delivered that way (the
    /// proxy's, the image server's); never for files served as their origin would.
    ///
    /// A block left exactly full grows anyway: `HeaderMap` makes room for one more field before
    /// it looks the name up, even to replace a value (its table holds three quarters of its
    /// slots: 12 fields in 16 slots, which a gzip variant of a typical response had, cost
    /// 1,100 instructions more per hit than the identity variant's 11). So one slot is kept free.
    pub fn reserve_stamp(&mut self, status: &HeaderName) {
        for v in self.variants.iter_mut().flatten() {
            v.head.insert(header::AGE, HeaderValue::from_static("0"));
            v.head.insert(status.clone(), HeaderValue::from_static(""));
            v.head.reserve(1);
            // The field list as long as it needs; the index keeps the free slot.
            v.head = v.head.clone();
        }
        self.recount();
        self.stamp = Some(status.clone());
    }

    /// Counts a lookup that found this entry.
    #[inline]
    pub fn count_hit(&self) {
        use std::sync::atomic::Ordering::Relaxed;
        self.hits
            .store(self.hits.load(Relaxed).wrapping_add(1), Relaxed);
    }

    /// Lookups that found this entry so far (approximate under concurrency).
    pub fn hits(&self) -> u64 {
        self.hits.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The same response with another set of bodies (compressed variants added); it shares
    /// this entry's [`Pending`], if any.
    pub fn with_bodies(&self, bodies: Vec<(Encoding, Bytes)>) -> Entry {
        let mut e = Entry::build(
            self.status,
            self.headers.clone(),
            bodies,
            self.freshness,
            self.negotiated,
        );
        e.auth_ok = self.auth_ok;
        e.tags = self.tags.clone();
        e.pending = self.pending.clone();
        e.selection = self.selection.clone();
        e.hits = std::sync::atomic::AtomicU64::new(self.hits());
        if let Some(status) = &self.stamp {
            e.reserve_stamp(status);
        }
        e
    }

    /// The same bodies with refreshed headers and freshness (after a 304, RFC 9111 §4.3.4).
    pub fn refreshed(&self, headers: HeaderMap, freshness: Freshness) -> Entry {
        let mut e = Entry::build(
            self.status,
            headers,
            self.bodies(),
            freshness,
            self.negotiated,
        );
        e.auth_ok = self.auth_ok;
        // Tags came from the stored response (the tag field is not stored): a refreshed entry
        // keeps them, so purge by tag still finds it.
        e.tags = self.tags.clone();
        e.selection = self.selection.clone();
        e.hits = std::sync::atomic::AtomicU64::new(self.hits());
        if let Some(status) = &self.stamp {
            e.reserve_stamp(status);
        }
        e
    }

    /// Whether larder negotiates its coding but holds only the identity body so far (its
    /// compressed variants are to be built).
    #[inline]
    pub fn lacks_variants(&self) -> bool {
        self.negotiated && self.encodings == 1
    }

    /// The stored encodings, smallest body first.
    #[inline]
    pub fn by_size(&self) -> &[Encoding] {
        &self.by_size[..usize::from(self.encodings)]
    }

    /// The variant of one encoding, if stored.
    #[inline]
    pub fn variant(&self, e: Encoding) -> Option<&Variant> {
        self.variants[e as usize].as_ref()
    }

    /// The bodies of every stored encoding (for rebuilding an entry with new metadata).
    pub fn bodies(&self) -> Vec<(Encoding, Bytes)> {
        Encoding::ALL
            .iter()
            .filter_map(|e| self.variant(*e).map(|v| (*e, v.body.clone())))
            .collect()
    }

    /// Whether larder negotiates the encoding of this entry (it holds a compressed variant or
    /// was stored identity-only pending compression).
    pub fn has_encoding(&self, e: Encoding) -> bool {
        self.variants[e as usize].is_some()
    }
}

/// Whether the Vary field lists `name` (case-insensitive).
pub fn vary_lists(headers: &HeaderMap, name: &str) -> bool {
    headers
        .get_all(header::VARY)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|s| s.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case(name))
}

/// Whether Vary names a field other than Accept-Encoding (larder negotiates that one itself).
pub fn vary_names_other_than_accept_encoding(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::VARY)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|s| s.split(','))
        .map(str::trim)
        .any(|t| !t.is_empty() && !t.eq_ignore_ascii_case("accept-encoding"))
}

#[cfg(test)]
pub(crate) mod tests_support {
    use super::*;
    use std::time::Duration;

    pub(crate) fn fresh() -> Freshness {
        Freshness::own(Duration::from_secs(60), std::time::SystemTime::now())
    }
}

#[cfg(test)]
mod tests {
    use super::tests_support::fresh;
    use super::*;

    /// An entry of `h` with a 10-byte identity body and a 4-byte gzip one, negotiated.
    fn two_variants(h: HeaderMap) -> Entry {
        Entry::build(
            StatusCode::OK,
            h,
            vec![
                (Encoding::Identity, Bytes::from_static(b"0123456789")),
                (Encoding::Gzip, Bytes::from_static(b"0123")),
            ],
            fresh(),
            true,
        )
    }

    #[test]
    fn prepares_every_variant() {
        let mut h = HeaderMap::new();
        h.insert(header::ETAG, HeaderValue::from_static("\"v1\""));
        h.insert(header::CONTENT_LENGTH, HeaderValue::from_static("999"));
        let e = two_variants(h);
        assert_eq!(e.by_size(), &[Encoding::Gzip, Encoding::Identity]);
        let g = e.variant(Encoding::Gzip).unwrap();
        assert_eq!(g.head[header::CONTENT_LENGTH], "4");
        assert_eq!(g.head[header::CONTENT_ENCODING], "gzip");
        assert_eq!(g.head[header::ETAG], "W/\"v1\"");
        assert_eq!(g.head[header::VARY], "Accept-Encoding");
        let i = e.variant(Encoding::Identity).unwrap();
        assert_eq!(i.head[header::CONTENT_LENGTH], "10");
        assert_eq!(i.head[header::ETAG], "\"v1\"");
        assert!(e.variant(Encoding::Br).is_none());
    }

    /// Stored values are copies, not slices of the buffer they were parsed from (which they
    /// would keep alive whole), in their order, repeated fields and sensitivity kept.
    #[test]
    fn stored_values_hold_no_slice_of_their_source() {
        let read_buffer = Bytes::from(b"text/html; charset=utf-8<a><b>rest of the buffer".to_vec());
        let mut h = HeaderMap::new();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_maybe_shared(read_buffer.slice(0..24)).unwrap(),
        );
        h.append(
            header::LINK,
            HeaderValue::from_maybe_shared(read_buffer.slice(24..27)).unwrap(),
        );
        h.append(
            header::LINK,
            HeaderValue::from_maybe_shared(read_buffer.slice(27..30)).unwrap(),
        );
        let mut secret = HeaderValue::from_static("s");
        secret.set_sensitive(true);
        h.insert(HeaderName::from_static("x-secret"), secret);
        let e = two_variants(h);
        assert!(
            read_buffer.is_unique(),
            "a stored value still slices the read buffer"
        );
        for head in [&e.headers, &e.variant(Encoding::Gzip).unwrap().head] {
            assert_eq!(head[header::CONTENT_TYPE], "text/html; charset=utf-8");
            let links: Vec<_> = head.get_all(header::LINK).iter().collect();
            assert_eq!(links, ["<a>", "<b>"]);
            assert!(head["x-secret"].is_sensitive());
        }
    }

    /// A hit's copy of a stamped block takes Age and the cache-status field without growing,
    /// whatever the number of stored fields (the table fills at three quarters of a power of 2).
    #[test]
    fn a_stamped_copy_never_grows() {
        let status = HeaderName::from_static("x-cache");
        for n in 0..40 {
            let mut h = HeaderMap::new();
            for i in 0..n {
                h.insert(
                    HeaderName::try_from(format!("x-field-{i}")).unwrap(),
                    HeaderValue::from_static("v"),
                );
            }
            let mut e = two_variants(h);
            e.reserve_stamp(&status);
            for enc in [Encoding::Identity, Encoding::Gzip] {
                let mut copy = e.variant(enc).unwrap().head.clone();
                let cap = copy.capacity();
                copy.insert(header::AGE, HeaderValue::from_static("5"));
                copy.insert(status.clone(), HeaderValue::from_static("HIT"));
                assert_eq!(copy.capacity(), cap, "{n} fields, {enc:?}");
            }
        }
    }
}
