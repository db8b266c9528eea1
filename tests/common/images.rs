//! Test images: the photo in bench/data, PNGs encoded from pixels, EXIF orientation.

/// A 640×856 JPEG photo.
pub const PHOTO: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/bench/data/photo-640x856.jpg");

/// The bytes of [`PHOTO`].
pub fn photo() -> Vec<u8> {
    std::fs::read(PHOTO).expect("bench/data photo in the repository")
}

/// A PNG of `w`×`h` pixels `px` in `color` at `depth` bits.
pub fn encode_png(
    w: u32,
    h: u32,
    color: png::ColorType,
    depth: png::BitDepth,
    px: &[u8],
) -> Vec<u8> {
    let mut out = Vec::new();
    let mut e = png::Encoder::new(&mut out, w, h);
    e.set_color(color);
    e.set_depth(depth);
    let mut wr = e.write_header().unwrap();
    wr.write_image_data(px).unwrap();
    wr.finish().unwrap();
    out
}

/// `jpeg` with an EXIF APP1 segment tagging `orientation` (1-8) inserted after its SOI marker.
pub fn exif_oriented(jpeg: &[u8], orientation: u8) -> Vec<u8> {
    let tiff: &[u8] = &[
        b'M',
        b'M',
        0,
        0x2a,
        0,
        0,
        0,
        0x08,
        0,
        0x01,
        0x01,
        0x12,
        0,
        0x03,
        0,
        0,
        0,
        0x01,
        0,
        orientation,
        0,
        0,
        0,
        0,
        0,
        0,
    ];
    let mut app1 = b"Exif\0\0".to_vec();
    app1.extend_from_slice(tiff);
    let mut tagged = jpeg[..2].to_vec();
    tagged.extend_from_slice(&[0xFF, 0xE1]);
    tagged.extend_from_slice(&((app1.len() + 2) as u16).to_be_bytes());
    tagged.extend_from_slice(&app1);
    tagged.extend_from_slice(&jpeg[2..]);
    tagged
}
