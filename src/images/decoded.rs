//! The decoded originals an image proxy route keeps for the next variants of the same original
//! (its `decoded_cache`), so that a burst of widths, formats and crops of one photo decodes it
//! once: a JPEG's Huffman decoding is most of a small variant's CPU, and shrink-on-load cannot
//! skip it.
//!
//! What is kept is the first frame as [`codec::decode_colour`] gives it: converted to sRGB (or
//! with its ICC profile, when kept), not yet turned (orientation differs by request and is
//! cheap). Its key is everything that decode depends on: the original's id (a changed original
//! has a new one, so never finds an old raster), the JPEG DCT scale in eighths (a variant finds
//! a raster at exactly its own scale only, so it gets the pixels decoding afresh would give:
//! a finer one would give other pixels), gray (a JPEG decoded as luma), and whether the
//! profile was kept. Other formats decode whole at full size whatever is asked: one key each.
//!
//! A JPEG decoded to be kept is decoded whole at its scale, not just the band of rows one crop
//! needs, so that every crop at that scale can use it; on a route that keeps originals a
//! variant is thus made from the whole frame, hit or miss alike. It differs from the band
//! decode of a route that keeps none only in its first and last rows, where the resize's
//! filter reads the real rows beyond the band (tests/image_decoded.rs bounds the difference).
//! Only frames up to an eighth of the cache are kept, so that it holds eight at least; a
//! larger one is decoded as before, its band only, and not kept. Animations whose output
//! animates decode every frame elsewhere ([`super::animation`]) and are not kept.
//!
//! Storage is `quick_cache`, weighted by bytes (least recently used first out, scan-resistant,
//! as the response cache), its bytes taken out of the pool's `decode_memory` by the route.
//! Transforms of one original running at once on the pool's workers decode it once: the others
//! wait for the first's raster (quick_cache's placeholder). Evicted pixels are reported freed
//! to [`crate::memory`], as a finished transform's buffers are.

use std::sync::Arc;

use quick_cache::sync::{Cache, GuardResult};

use super::codec::{self, Band, Decoded};
use super::raster::{CodecError, Limits, Raster};
use super::sniff::{ImageFormat, Probe};
use super::stats::Stats;

/// Everything a decode depends on besides the band of rows.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Key {
    id: Box<str>,
    /// The JPEG DCT scale in eighths (8 for other formats).
    eighths: u8,
    gray: bool,
    keep_icc: bool,
}

/// A kept decode.
struct Kept {
    raster: Raster,
    icc: Option<Vec<u8>>,
}

impl Kept {
    fn decoded(&self) -> Decoded {
        Decoded {
            raster: self.raster.clone(),
            band: Band {
                top: 0,
                full_height: self.raster.height,
            },
            icc: self.icc.clone(),
        }
    }
}

/// Weighs a kept decode by its bytes.
#[derive(Clone)]
struct ByBytes;

impl quick_cache::Weighter<Key, Arc<Kept>> for ByBytes {
    fn weight(&self, key: &Key, val: &Arc<Kept>) -> u64 {
        (val.raster.data.len() + val.icc.as_ref().map_or(0, Vec::len) + key.id.len()) as u64 + 64
    }
}

/// quick_cache's hook on evictions: the pixels are freed.
#[derive(Clone, Default)]
struct Freed;

impl quick_cache::Lifecycle<Key, Arc<Kept>> for Freed {
    type RequestState = ();

    #[inline]
    fn begin_request(&self) {}

    fn on_evict(&self, _: &mut (), key: Key, val: Arc<Kept>) {
        crate::memory::memory_freed(quick_cache::Weighter::weight(&ByBytes, &key, &val));
    }
}

/// A route's kept decoded originals, at most `capacity` bytes.
pub struct DecodedCache {
    held: Option<Cache<Key, Arc<Kept>, ByBytes, quick_cache::DefaultHashBuilder, Freed>>,
    /// The largest frame kept, in bytes.
    largest: u64,
}

impl DecodedCache {
    /// Keeps up to `capacity` bytes; 0 keeps nothing.
    pub fn new(capacity: u64) -> DecodedCache {
        let largest = capacity / 8;
        let held = (capacity > 0).then(|| {
            // quick_cache splits the capacity into shards and admits nothing above 97% of one:
            // few enough that the largest frame fits one with room (a quarter of the capacity).
            let options = quick_cache::OptionsBuilder::new()
                .estimated_items_capacity((capacity / (256 << 10)).clamp(16, 1 << 16) as usize)
                .weight_capacity(capacity)
                .shards(4)
                .build()
                .expect("capacity and shard count are set");
            Cache::with_options(options, ByBytes, Default::default(), Freed)
        });
        DecodedCache { held, largest }
    }

    /// The bytes held now.
    pub fn bytes(&self) -> u64 {
        self.held.as_ref().map_or(0, Cache::weight)
    }
}

/// A route's kept originals and the id of the original being decoded.
pub struct Keep<'a> {
    pub cache: &'a DecodedCache,
    /// The original's id ([`super::source::Original::id`]).
    pub id: &'a str,
    /// Where hits, misses and bytes are counted.
    pub stats: &'a Stats,
}

/// What [`codec::decode_colour`] is asked for.
#[derive(Debug, Clone, Copy)]
pub struct Want {
    pub need: (u32, u32),
    pub gray: bool,
    pub rows: (f64, f64),
    pub keep_icc: bool,
}

/// The first frame of `src` as `want` asks, decoded, or the one `keep` holds (decoded whole
/// then kept, when it is small enough). Without `keep`: [`codec::decode_colour`] itself.
pub fn decode(
    keep: Option<&Keep<'_>>,
    src: &[u8],
    probe: &Probe,
    want: Want,
    limits: &Limits,
) -> Result<Decoded, CodecError> {
    let fresh = |rows| {
        let Want {
            need,
            gray,
            keep_icc,
            ..
        } = want;
        codec::decode_colour(src, probe, need, gray, rows, limits, keep_icc)
    };
    let Some((keep, held)) = keep.and_then(|k| Some((k, k.cache.held.as_ref()?))) else {
        return fresh(want.rows);
    };
    let jpeg = probe.format == ImageFormat::Jpeg;
    let eighths = if jpeg {
        super::jpeg::scale_eighths(probe.width, probe.height, want.need)
    } else {
        8
    };
    let key = Key {
        id: keep.id.into(),
        eighths: eighths as u8,
        gray: jpeg && want.gray,
        keep_icc: want.keep_icc,
    };
    // The frame's bytes at that scale: 4 a pixel at most (CMYK while decoding, RGBA).
    let side = |d: u32| u64::from((d * eighths).div_ceil(8));
    let bytes = side(probe.width) * side(probe.height) * if key.gray { 1 } else { 4 };
    if bytes > keep.cache.largest {
        keep.stats.decoded_lookup(false);
        return fresh(want.rows);
    }
    match held.get_value_or_guard(&key, None) {
        GuardResult::Value(kept) => {
            keep.stats.decoded_lookup(true);
            Ok(kept.decoded())
        }
        GuardResult::Guard(slot) => {
            keep.stats.decoded_lookup(false);
            let d = fresh((0.0, 1.0))?;
            let kept = Kept {
                raster: d.raster,
                icc: d.icc,
            };
            let out = kept.decoded();
            let _ = slot.insert(Arc::new(kept));
            keep.stats.decoded_held(held.weight());
            Ok(out)
        }
        // No timeout is given: never.
        GuardResult::Timeout => fresh(want.rows),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::images::sniff;

    const LIMITS: Limits = Limits {
        max_frames: 1,
        max_animation_pixels: 500_000_000,
        ..Limits::DEFAULT
    };

    fn jpeg(w: u32, h: u32, seed: u8) -> Vec<u8> {
        let data = (0..w * h * 3)
            .map(|i| (i % 251) as u8 ^ seed)
            .collect::<Vec<u8>>();
        let img = Raster {
            width: w,
            height: h,
            channels: 3,
            data,
        };
        codec::encode(&img, ImageFormat::Jpeg, 90).unwrap()
    }

    const WANT: Want = Want {
        need: (40, 40),
        gray: false,
        rows: (0.25, 0.75),
        keep_icc: false,
    };

    /// A kept decode is the whole frame at the scale asked, the pixels a whole decode gives;
    /// another scale, gray, or another original is decoded afresh.
    #[test]
    fn kept_at_its_own_scale_and_original_only() {
        let cache = DecodedCache::new(8 << 20);
        let stats = Stats::default();
        let src = jpeg(160, 160, 0);
        let probe = sniff::probe(&src).unwrap();
        let keep = |id| Keep {
            cache: &cache,
            id,
            stats: &stats,
        };
        let whole = codec::decode_colour(&src, &probe, (40, 40), false, (0.0, 1.0), &LIMITS, false)
            .unwrap();
        let first = decode(Some(&keep("a")), &src, &probe, WANT, &LIMITS).unwrap();
        assert_eq!(first.raster, whole.raster);
        assert_eq!((first.band.top, first.band.full_height), (0, 40));
        let held = cache.bytes();
        assert!(held >= 40 * 40 * 3, "{held}");
        let again = decode(Some(&keep("a")), &src, &probe, WANT, &LIMITS).unwrap();
        assert_eq!(again.raster, whole.raster);
        assert_eq!(cache.bytes(), held, "a hit adds nothing");
        // Finer: another key, decoded afresh at its own scale.
        let finer = Want {
            need: (80, 80),
            ..WANT
        };
        let d = decode(Some(&keep("a")), &src, &probe, finer, &LIMITS).unwrap();
        assert_eq!((d.raster.width, d.raster.height), (80, 80));
        let gray = Want { gray: true, ..WANT };
        assert_eq!(
            decode(Some(&keep("a")), &src, &probe, gray, &LIMITS)
                .unwrap()
                .raster
                .channels,
            1
        );
        // A new original under a new id: its own pixels, never the old ones.
        let changed = jpeg(160, 160, 0x55);
        let p2 = sniff::probe(&changed).unwrap();
        let d = decode(Some(&keep("b")), &changed, &p2, WANT, &LIMITS).unwrap();
        let want = codec::decode_colour(&changed, &p2, (40, 40), false, (0.0, 1.0), &LIMITS, false)
            .unwrap();
        assert_eq!(d.raster, want.raster);
        assert_ne!(d.raster, whole.raster);
    }

    /// The bytes held stay within the capacity; a frame over an eighth of it is not kept.
    #[test]
    fn bounded_by_its_capacity() {
        let cache = DecodedCache::new(1 << 20);
        let stats = Stats::default();
        let want = Want {
            need: (160, 160),
            rows: (0.0, 1.0),
            ..WANT
        };
        for i in 0..40u8 {
            let src = jpeg(160, 160, i);
            let probe = sniff::probe(&src).unwrap();
            let id = format!("id{i}");
            let keep = Keep {
                cache: &cache,
                id: &id,
                stats: &stats,
            };
            decode(Some(&keep), &src, &probe, want, &LIMITS).unwrap();
            assert!(cache.bytes() <= 1 << 20, "{}", cache.bytes());
        }
        assert!(cache.bytes() > 0);
        // 400x400 at full scale is 640,000 bytes: over an eighth of 1 MiB.
        let src = jpeg(400, 400, 1);
        let probe = sniff::probe(&src).unwrap();
        let keep = Keep {
            cache: &cache,
            id: "big",
            stats: &stats,
        };
        let before = cache.bytes();
        let big = Want {
            need: (400, 400),
            ..want
        };
        decode(Some(&keep), &src, &probe, big, &LIMITS).unwrap();
        assert_eq!(cache.bytes(), before);
        assert_eq!(DecodedCache::new(0).bytes(), 0);
    }
}
