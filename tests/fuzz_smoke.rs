//! A bounded, deterministic run of the fuzz targets' checks on stable Rust: mutated seeds from a
//! corpus of real inputs, so every `cargo test` exercises the parsers with hostile bytes. The
//! open-ended search is `cargo +nightly fuzz run NAME` in `fuzz/`.

mod fuzz_checks;

/// xorshift64*: a fixed-seed generator, so failures reproduce.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

const SEEDS: &[&[u8]] = &[
    b"max-age=60, s-maxage=\"30\", private=\"Set-Cookie, X\", no-cache",
    b"gzip;q=0.5, br, *;q=0, identity;q=0.001",
    b"\x00\x00\x00\x00\x00\x10\x00\x00bytes=0-1,5-,-3,10-20",
    b"/a/%2e%2e/%252e/b%00c/.git/..\\x/%c0%ae",
    b"w=100&h=100&p=1&g=1&q=80&f=webp&r=90&x=5&y=5&t=thumb",
    b"\xff\xd8\xff\xe0\x00\x10JFIF\x00\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDRRIFF\x00\x00\x00\x00WEBPVP8 ",
    b"[[listener]]\naddr = \"127.0.0.1:0\"\n[[listener.route]]\nproxy = { upstream = \"http://a:1\" }\n[cache]\nmax_size = \"1MiB\"",
    b"Accept-Language, X-Foo ,*, accept-encoding",
    b"price < 100 and (color == \"r\\\"ed\" or tags[0] in [1, \"x\", null]) && !sold || $id != \"cars/1\"",
    // An entry record (larder::cache::record): two bodies, tags, a Vary selection.
    ENTRY_RECORD,
    // An AVIF header: ftyp, meta (pitm, iprp: ipco with ispe, colr, irot; ipma), mdat.
    b"\x00\x00\x00\x18ftypavif\x00\x00\x00\x00mif1avif\x00\x00\x00pmeta\x00\x00\x00\x00\x00\x00\x00\x0epitm\x00\x00\x00\x00\x00\x01\x00\x00\x00Viprp\x00\x00\x008ipco\x00\x00\x00\x14ispe\x00\x00\x00\x00\x00\x00\x02\x80\x00\x00\x01\xe0\x00\x00\x00\x13colrnclx\x00\x01\x00\x0d\x00\x01\x80\x00\x00\x00\x09irot\x01\x00\x00\x00\x16ipma\x00\x00\x00\x00\x00\x00\x00\x01\x00\x01\x03\x81\x02\x83\x00\x00\x00\x0bmdat\x12\x00\x0a",
    // JPEG XL (a bare codestream and the container, made by cjxl) and a HEIC (heif-enc):
    // tests/data/README.md.
    include_bytes!("data/flat-160x120.jxl"),
    include_bytes!("data/flat-160x120-container.jxl"),
    include_bytes!("data/flat-160x120.heic"),
    // imgproxy's and thumbor's URLs.
    b"insecure/rs:fill:100:100:1/g:sm/c:0.5:300:nowe:10:5/pd:1:2:3:4/bg:ff0000/ex:1:ce/exar:1/dpr:2/z:1.5/pr:thumb/bl:2/sh:1/rot:90/fl:1:0/t:10:ff0000:1:1/q:80/mb:1000/plain/http%3A%2F%2Fa/b.jpg@webp",
    b"unsafe/trim/10x20:300x400/fit-in/-100x-0/left/top/smart/filters:quality(80):blur(2):fill(red):format(webp)/aHR0cDovL2EvYi5qcGc=",
];

const ENTRY_RECORD: &[u8] = b"\x02\xf2\x93\x9ab\x00\xc8\x03\x00\x00\x00\x00\x00\x00\x00<\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x05\x00\x00\x00\x00\x00\x00\x00\x00kI\xd2\x00\x00\x00\x01\xf4\x00\x00\x00\x00\x00\x00\x00\x1e\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x03\x00\x00\x00\x04etag\x00\x00\x00\x03\x22a\x22\x00\x00\x00\x04vary\x00\x00\x00 Accept-Language, Accept-Encoding\x00\x00\x00\x0ccontent-type\x00\x00\x00\x0atext/plain\x00\x00\x00\x01\x00\x00\x00\x01t\x00\x00\x00\x01\x00\x00\x00\x0faccept-language\x01\x00\x00\x00\x02en\x02\x00\x00\x00\x00\x05hello\x01\x00\x00\x00\x02\x1f\x8b";

/// The entry seed is a record of the current version, so mutations of it reach past the
/// version byte (update it when `ENTRY_VERSION` changes).
#[test]
fn the_entry_record_seed_decodes() {
    let entry = larder::cache::Entry::decode(bytes::Bytes::from_static(ENTRY_RECORD)).unwrap();
    assert_eq!(entry.tags.len(), 1);
    assert!(entry.selection.varies());
}

/// The image URL seeds parse, so that their mutations reach the geometry checks.
#[test]
fn the_image_url_seeds_parse() {
    let cfg = larder::config::ImgproxyConfig::default();
    let now = std::time::SystemTime::now();
    let imgproxy = std::str::from_utf8(SEEDS[SEEDS.len() - 2]).unwrap();
    let thumbor = std::str::from_utf8(SEEDS[SEEDS.len() - 1]).unwrap();
    larder::images::imgproxy::parse(imgproxy.replace("/pr:thumb", "").as_str(), &cfg, now).unwrap();
    larder::images::thumbor::parse(thumbor, &Default::default()).unwrap();
}

const INTERESTING: &[&[u8]] = &[
    b",",
    b";",
    b"=",
    b"\"",
    b"\\",
    b"%",
    b"%2f",
    b"..",
    b"/",
    b"-",
    b"*",
    b"q=",
    b"99999999999999999999",
    b"\xff",
    b"\x00",
    b" ",
    b"[[",
    b"]]",
    b"\n",
    b"bytes=",
    b"&",
    b"w=",
    b"-1",
];

fn mutate(rng: &mut Rng, seed: &[u8]) -> Vec<u8> {
    let mut v = seed.to_vec();
    for _ in 0..=rng.below(8) {
        match rng.below(5) {
            0 if !v.is_empty() => {
                let i = rng.below(v.len());
                v[i] = rng.next() as u8;
            }
            1 if !v.is_empty() => {
                let i = rng.below(v.len());
                v.remove(i);
            }
            2 => {
                let i = rng.below(v.len() + 1);
                let ins = INTERESTING[rng.below(INTERESTING.len())];
                v.splice(i..i, ins.iter().copied());
            }
            3 if v.len() > 2 => {
                let a = rng.below(v.len());
                let b = rng.below(v.len());
                let (a, b) = (a.min(b), a.max(b));
                let chunk = v[a..b].to_vec();
                v.extend_from_slice(&chunk);
            }
            _ => v.truncate(rng.below(v.len() + 1)),
        }
    }
    v
}

#[test]
fn parsers_survive_mutated_inputs() {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    for (name, check) in fuzz_checks::ALL {
        for _ in 0..3000 {
            let seed = SEEDS[rng.below(SEEDS.len())];
            let input = mutate(&mut rng, seed);
            let result = std::panic::catch_unwind(|| check(&input));
            assert!(
                result.is_ok(),
                "{name} failed on {:?}",
                String::from_utf8_lossy(&input)
            );
        }
    }
}
