//! Entry records: the versioned binary encoding of an [`Entry`], for tiers that keep bytes
//! rather than objects (a disk tier, a shared tier): [`Entry::encode`] writes one record,
//! [`Entry::decode`] reads it back into an entry ready to serve.
//!
//! A record holds what cannot be derived: the status, the stored headers, the freshness (times
//! as wall-clock, so a record read after a restart or on another node ages correctly), the tags,
//! whether the entry may answer requests with Authorization, whether larder negotiates its
//! coding, its Vary selection, and every stored encoding's body. What [`Entry::build`] derives
//! (the validators, each encoding's header block, the order by size, the weight) is rebuilt on
//! decode, so it never disagrees with the code reading it.
//!
//! Records come back from outside the process (a file, the network), so decoding trusts nothing:
//! a CRC-32 over everything after it is checked first (bytes changed inside a body, where no
//! length or value check would see them, are caught), every length is checked against what is
//! left, every value validated, and any failure is an error, never a panic. A record of another
//! [`ENTRY_VERSION`] is an error too: to a tier, a miss. The checksum catches corruption, not
//! forgery: a shared tier's records are signed on top of it (`shared.rs`, `shared_key`).
//!
//! Layout (integers big-endian; `dur` is u64 seconds and u32 nanoseconds; `str` is a u32 length
//! and that many bytes):
//!
//! ```text
//! u8 version | u32 crc32 (of everything after it)
//! u16 status | u8 flags (auth_ok, negotiated, always_revalidate, must_revalidate)
//! dur lifetime | dur initial_age | dur received (since the Unix epoch)
//! dur stale_while_revalidate | dur stale_if_error
//! u32 n, n × (str name, str value)                       stored header fields
//! u32 n, n × str                                         tags
//! u32 n, n × str name, n × (u8 present, [str value])      Vary selection
//! u8 n (1-4), n × (u8 encoding, str body)                 bodies
//! ```

use std::time::{Duration, UNIX_EPOCH};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http::header::{HeaderMap, HeaderName, HeaderValue};
use http::StatusCode;

use super::entry::Entry;
use super::policy::Freshness;
use super::vary::Selection;
use crate::compress::Encoding;

/// Version of the entry encoding: bumped whenever a record's layout or the meaning of a stored
/// field changes. Records of another version are not read. 2: the CRC-32 after the version.
pub const ENTRY_VERSION: u8 = 2;

/// Version and CRC-32.
const HEAD: usize = 1 + 4;

const AUTH_OK: u8 = 1;
const NEGOTIATED: u8 = 2;
const ALWAYS_REVALIDATE: u8 = 4;
const MUST_REVALIDATE: u8 = 8;
const FLAGS: u8 = AUTH_OK | NEGOTIATED | ALWAYS_REVALIDATE | MUST_REVALIDATE;

/// Why a record could not be read back. A tier treats each the same way: a miss.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("entry record of version {0}, not {ENTRY_VERSION}")]
    UnknownVersion(u8),
    #[error("entry record ends early")]
    Truncated,
    #[error("entry record fails its checksum")]
    Checksum,
    #[error("entry record is corrupt: {0}")]
    Corrupt(&'static str),
}

/// A part of an entry too large for the encoding's 32-bit lengths.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0} too large for an entry record")]
pub struct TooLarge(&'static str);

impl Entry {
    /// The entry as one record of the current [`ENTRY_VERSION`].
    pub fn encode(&self) -> Result<Bytes, TooLarge> {
        let bodies = self.bodies();
        let size = 68
            + self
                .headers
                .iter()
                .map(|(k, v)| 8 + k.as_str().len() + v.len())
                .sum::<usize>()
            + self.tags.iter().map(|t| 4 + t.len()).sum::<usize>()
            + bodies.iter().map(|(_, b)| 5 + b.len()).sum::<usize>();
        let mut out = BytesMut::with_capacity(size);
        out.put_u8(ENTRY_VERSION);
        out.put_u32(0); // the CRC-32, once the rest is written
        out.put_u16(self.status.as_u16());
        let f = &self.freshness;
        let flags = [
            (self.auth_ok, AUTH_OK),
            (self.negotiated, NEGOTIATED),
            (f.always_revalidate, ALWAYS_REVALIDATE),
            (f.must_revalidate, MUST_REVALIDATE),
        ];
        out.put_u8(
            flags
                .iter()
                .filter(|(on, _)| *on)
                .fold(0, |m, (_, b)| m | b),
        );
        put_duration(&mut out, f.lifetime);
        put_duration(&mut out, f.initial_age);
        // A clock before 1970 is written as the epoch (only ages longer).
        put_duration(
            &mut out,
            f.received.duration_since(UNIX_EPOCH).unwrap_or_default(),
        );
        put_duration(&mut out, f.stale_while_revalidate);
        put_duration(&mut out, f.stale_if_error);

        put_len(&mut out, self.headers.len(), "header list")?;
        for (name, value) in &self.headers {
            put_str(&mut out, name.as_str().as_bytes(), "header name")?;
            put_str(&mut out, value.as_bytes(), "header value")?;
        }
        put_len(&mut out, self.tags.len(), "tag list")?;
        for tag in self.tags.iter() {
            put_str(&mut out, tag.as_bytes(), "tag")?;
        }
        let names = self.selection.names();
        put_len(&mut out, names.len(), "Vary selection")?;
        for name in names {
            put_str(&mut out, name.as_str().as_bytes(), "Vary field name")?;
        }
        for value in self.selection.values() {
            match value {
                None => out.put_u8(0),
                Some(v) => {
                    out.put_u8(1);
                    put_str(&mut out, v.as_bytes(), "Vary field value")?;
                }
            }
        }
        out.put_u8(bodies.len() as u8); // at most one per encoding: 4
        for (encoding, body) in &bodies {
            out.put_u8(*encoding as u8);
            put_str(&mut out, body, "body")?;
        }
        set_checksum(&mut out);
        Ok(out.freeze())
    }

    /// Reads back a record written by [`Entry::encode`]. The bodies are slices of `record`
    /// (no copy), not put in memory files ([`Entry::into_mapped`] does that). Any record that is not exactly one valid entry of [`ENTRY_VERSION`] with
    /// its checksum right is an error.
    pub fn decode(record: Bytes) -> Result<Entry, DecodeError> {
        let mut r = Reader(record);
        let version = r.u8()?;
        if version != ENTRY_VERSION {
            return Err(DecodeError::UnknownVersion(version));
        }
        let crc = r.u32()?;
        if crc32fast::hash(&r.0) != crc {
            return Err(DecodeError::Checksum);
        }
        let status = StatusCode::from_u16(r.u16()?).map_err(|_| corrupt("status"))?;
        let flags = r.u8()?;
        if flags & !FLAGS != 0 {
            return Err(corrupt("flags"));
        }
        let lifetime = r.duration()?;
        let initial_age = r.duration()?;
        let received = UNIX_EPOCH
            .checked_add(r.duration()?)
            .ok_or(corrupt("received time"))?;
        let freshness = Freshness {
            lifetime,
            initial_age,
            received,
            always_revalidate: flags & ALWAYS_REVALIDATE != 0,
            must_revalidate: flags & MUST_REVALIDATE != 0,
            stale_while_revalidate: r.duration()?,
            stale_if_error: r.duration()?,
        };

        let mut headers = HeaderMap::new();
        for _ in 0..r.u32()? {
            let name = HeaderName::from_bytes(&r.str()?).map_err(|_| corrupt("header name"))?;
            let value =
                HeaderValue::from_maybe_shared(r.str()?).map_err(|_| corrupt("header value"))?;
            headers
                .try_append(name, value)
                .map_err(|_| corrupt("too many header fields"))?;
        }
        let mut tags = Vec::new();
        for _ in 0..r.u32()? {
            tags.push(r.utf8()?);
        }
        let mut names = Vec::new();
        for _ in 0..r.u32()? {
            names.push(HeaderName::from_bytes(&r.str()?).map_err(|_| corrupt("Vary field name"))?);
        }
        let mut values = Vec::with_capacity(names.len());
        for _ in 0..names.len() {
            values.push(match r.u8()? {
                0 => None,
                1 => Some(r.utf8()?),
                _ => return Err(corrupt("Vary field value")),
            });
        }
        let selection =
            Selection::from_parts(names.into(), values.into()).ok_or(corrupt("Vary selection"))?;
        let count = r.u8()?;
        if count == 0 || count as usize > Encoding::ALL.len() {
            return Err(corrupt("body count"));
        }
        let mut bodies: Vec<(Encoding, Bytes)> = Vec::with_capacity(count as usize);
        for _ in 0..count {
            let id = r.u8()?;
            let encoding = Encoding::ALL
                .into_iter()
                .find(|e| *e as u8 == id)
                .ok_or(corrupt("encoding"))?;
            if bodies.iter().any(|(e, _)| *e == encoding) {
                return Err(corrupt("encoding stored twice"));
            }
            bodies.push((encoding, r.str()?));
        }
        if r.0.has_remaining() {
            return Err(corrupt("bytes after the record"));
        }

        // Not in memory files: most records read back are sent once (`Cache::promote` maps
        // what memory keeps).
        let negotiated = flags & NEGOTIATED != 0;
        let mut entry = Entry::build_as(status, headers, bodies, freshness, negotiated, false);
        entry.auth_ok = flags & AUTH_OK != 0;
        entry.tags = tags.into();
        entry.selection = selection;
        Ok(entry)
    }
}

/// Sets the CRC-32 of record bytes to what they hold (a CRC is no secret), so that fuzzing and
/// tests reach the checks behind it; bytes shorter than the head are left as they are.
pub fn set_checksum(bytes: &mut [u8]) {
    if bytes.len() >= HEAD {
        let crc = crc32fast::hash(&bytes[HEAD..]);
        bytes[1..HEAD].copy_from_slice(&crc.to_be_bytes());
    }
}

fn corrupt(what: &'static str) -> DecodeError {
    DecodeError::Corrupt(what)
}

fn put_duration(out: &mut BytesMut, d: Duration) {
    out.put_u64(d.as_secs());
    out.put_u32(d.subsec_nanos());
}

fn put_len(out: &mut BytesMut, n: usize, what: &'static str) -> Result<(), TooLarge> {
    out.put_u32(u32::try_from(n).map_err(|_| TooLarge(what))?);
    Ok(())
}

fn put_str(out: &mut BytesMut, s: &[u8], what: &'static str) -> Result<(), TooLarge> {
    put_len(out, s.len(), what)?;
    out.put_slice(s);
    Ok(())
}

/// The unread rest of a record; every read checks that it is there.
struct Reader(Bytes);

impl Reader {
    fn u8(&mut self) -> Result<u8, DecodeError> {
        self.0.try_get_u8().map_err(|_| DecodeError::Truncated)
    }

    fn u16(&mut self) -> Result<u16, DecodeError> {
        self.0.try_get_u16().map_err(|_| DecodeError::Truncated)
    }

    fn u32(&mut self) -> Result<u32, DecodeError> {
        self.0.try_get_u32().map_err(|_| DecodeError::Truncated)
    }

    fn duration(&mut self) -> Result<Duration, DecodeError> {
        let secs = self.0.try_get_u64().map_err(|_| DecodeError::Truncated)?;
        let nanos = self.u32()?;
        if nanos >= 1_000_000_000 {
            return Err(corrupt("duration"));
        }
        Ok(Duration::new(secs, nanos))
    }

    /// A length-prefixed run of bytes, sliced from the record.
    fn str(&mut self) -> Result<Bytes, DecodeError> {
        let len = self.u32()? as usize;
        if self.0.remaining() < len {
            return Err(DecodeError::Truncated);
        }
        Ok(self.0.split_to(len))
    }

    fn utf8(&mut self) -> Result<Box<str>, DecodeError> {
        let bytes = self.str()?;
        std::str::from_utf8(&bytes)
            .map(Box::from)
            .map_err(|_| corrupt("text"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::header;

    /// An entry using every part of the record: two encodings, a repeated header field, tags, a
    /// Vary selection with a present and an absent field, sub-second durations.
    fn sample() -> Entry {
        let mut h = HeaderMap::new();
        h.insert(header::ETAG, HeaderValue::from_static("\"v1\""));
        h.insert(
            header::LAST_MODIFIED,
            HeaderValue::from_static("Sat, 21 Nov 2026 10:00:00 GMT"),
        );
        h.insert(
            header::VARY,
            HeaderValue::from_static("Accept-Language, X-Absent"),
        );
        h.append("x-two", HeaderValue::from_static("a"));
        h.append("x-two", HeaderValue::from_static("b"));
        let freshness = Freshness {
            lifetime: Duration::new(60, 250_000_000),
            initial_age: Duration::new(3, 7),
            received: UNIX_EPOCH + Duration::new(1_790_000_000, 123_456_789),
            always_revalidate: false,
            must_revalidate: true,
            stale_while_revalidate: Duration::from_secs(30),
            stale_if_error: Duration::ZERO,
        };
        let mut e = Entry::build(
            StatusCode::OK,
            h,
            vec![
                (
                    Encoding::Identity,
                    Bytes::from_static(b"hello, hello, hello"),
                ),
                (Encoding::Gzip, Bytes::from_static(b"gz")),
            ],
            freshness,
            true,
        );
        e.auth_ok = true;
        e.tags = vec![Box::from("red"), Box::from("blue")].into();
        let mut request = HeaderMap::new();
        request.insert("accept-language", HeaderValue::from_static("en"));
        e.selection = Selection::of(&e.headers, &request).unwrap();
        e
    }

    fn assert_same(a: &Entry, b: &Entry) {
        assert_eq!(a.status, b.status);
        assert_eq!(a.headers, b.headers);
        assert_eq!(a.freshness, b.freshness);
        assert_eq!(a.etag, b.etag);
        assert_eq!(a.last_modified, b.last_modified);
        assert_eq!(a.auth_ok, b.auth_ok);
        assert_eq!(a.negotiated, b.negotiated);
        assert_eq!(a.tags, b.tags);
        assert_eq!(a.selection, b.selection);
        assert_eq!(a.weight, b.weight);
        assert_eq!(a.by_size(), b.by_size());
        for e in Encoding::ALL {
            let (x, y) = (a.variant(e), b.variant(e));
            assert_eq!(x.map(|v| (&v.head, &v.body)), y.map(|v| (&v.head, &v.body)));
        }
    }

    #[test]
    fn round_trip() {
        let e = sample();
        let record = e.encode().unwrap();
        assert_eq!(record[0], ENTRY_VERSION);
        let back = Entry::decode(record.clone()).unwrap();
        assert_same(&e, &back);
        assert!(back.pending.is_none());
        // Canonical: the entry read back writes the same record.
        assert_eq!(back.encode().unwrap(), record);
        // A response that varies on nothing, stored with one coding as the origin sent it.
        let plain = Entry::build(
            StatusCode::NOT_FOUND,
            HeaderMap::new(),
            vec![(Encoding::Br, Bytes::new())],
            Freshness::own(Duration::from_secs(1), std::time::SystemTime::now()),
            false,
        );
        assert_same(&plain, &Entry::decode(plain.encode().unwrap()).unwrap());
    }

    #[test]
    fn bodies_are_slices_of_the_record() {
        let record = sample().encode().unwrap();
        let back = Entry::decode(record.clone()).unwrap();
        let body = &back.variant(Encoding::Identity).unwrap().body;
        let within = record.as_ptr_range();
        assert!(within.contains(&body.as_ptr()), "the body was copied");
    }

    /// A large body read back stays a slice of the record, not a memory file (most records are
    /// sent once); mapped as a stored body is once the entry is kept ([`Entry::into_mapped`]).
    #[test]
    fn large_bodies_are_mapped_only_when_kept() {
        let large = Bytes::from(vec![7u8; crate::mapped::DEFAULT_MIN * 2]);
        let stored = Entry::build(
            StatusCode::OK,
            HeaderMap::new(),
            vec![(Encoding::Identity, large.clone())],
            crate::cache::entry::tests_support::fresh(),
            false,
        );
        let record = stored.encode().unwrap();
        let back = Entry::decode(record.clone()).unwrap();
        let body = back.variant(Encoding::Identity).unwrap().body.clone();
        assert!(record.as_ptr_range().contains(&body.as_ptr()), "a slice");
        assert_eq!(crate::mapped::find(&body), None, "not in a memory file");
        let weight = back.weight;
        let kept = back.into_mapped();
        let mapped = &kept.variant(Encoding::Identity).unwrap().body;
        assert_eq!(*mapped, large);
        assert!(crate::mapped::find(mapped).is_some(), "in a memory file");
        assert_eq!(kept.weight, weight, "same weight");
    }

    #[test]
    fn every_truncation_is_an_error() {
        let record = sample().encode().unwrap();
        for n in 0..record.len() {
            assert!(
                Entry::decode(record.slice(..n)).is_err(),
                "a record cut to {n} bytes was read"
            );
        }
    }

    /// `bytes` with its CRC-32 made right again (to reach the checks behind it).
    fn resealed(mut bytes: Vec<u8>) -> Bytes {
        set_checksum(&mut bytes);
        bytes.into()
    }

    #[test]
    fn unknown_version_and_trailing_bytes_are_errors() {
        let record = sample().encode().unwrap();
        let mut other = record.to_vec();
        other[0] = ENTRY_VERSION + 1;
        assert_eq!(
            Entry::decode(other.into()).unwrap_err(),
            DecodeError::UnknownVersion(ENTRY_VERSION + 1)
        );
        // A record of the version before the checksum is a miss, not served.
        let mut old = record.to_vec();
        old[0] = 1;
        assert_eq!(
            Entry::decode(old.into()).unwrap_err(),
            DecodeError::UnknownVersion(1)
        );
        let mut longer = record.to_vec();
        longer.push(0);
        assert_eq!(
            Entry::decode(longer.clone().into()).unwrap_err(),
            DecodeError::Checksum
        );
        assert!(matches!(
            Entry::decode(resealed(longer)),
            Err(DecodeError::Corrupt(_))
        ));
    }

    #[test]
    fn a_changed_body_byte_fails_the_checksum() {
        let record = sample().encode().unwrap();
        let body = b"hello, hello, hello";
        let at = (record.windows(body.len()))
            .position(|w| w == body)
            .expect("the body is in the record");
        for i in [at, at + body.len() - 1] {
            let mut bad = record.to_vec();
            bad[i] ^= 0x20; // one letter's case: lengths and values all still valid
            assert_eq!(
                Entry::decode(bad.clone().into()).unwrap_err(),
                DecodeError::Checksum
            );
            // Only the checksum tells: resealed, the altered record reads.
            assert!(Entry::decode(resealed(bad)).is_ok());
        }
    }

    #[test]
    fn corrupt_records_never_panic() {
        let record = sample().encode().unwrap();
        // Every byte in turn set to values that break lengths, flags, names and encodings (the
        // checksum made right, so that the checks behind it are reached).
        for i in HEAD..record.len() {
            for b in [0x00, 0x01, 0x04, 0x7f, 0x80, 0xff] {
                let mut bad = record.to_vec();
                bad[i] = b;
                if let Ok(e) = Entry::decode(resealed(bad)) {
                    // Whatever decodes is a whole entry: it encodes again, and serves.
                    assert!(e.encode().is_ok());
                    assert!(!e.by_size().is_empty());
                }
            }
        }
        // Counts far beyond the record, in each count position.
        assert_eq!(
            Entry::decode(Bytes::from_static(b"\x02")).unwrap_err(),
            DecodeError::Truncated
        );
        let mut huge = record[..HEAD + 2 + 1 + 5 * 12].to_vec();
        huge.extend_from_slice(&u32::MAX.to_be_bytes());
        assert_eq!(
            Entry::decode(resealed(huge)).unwrap_err(),
            DecodeError::Truncated
        );
    }
}
