//! Test images: the photo in bench/data, PNGs encoded from pixels, EXIF orientation, HEIC grids
//! made of tests/data/flat-160x120.heic's boxes.

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

/// An ISOBMFF box.
fn bx(kind: &[u8; 4], body: &[u8]) -> Vec<u8> {
    let mut b = (8 + body.len() as u32).to_be_bytes().to_vec();
    b.extend_from_slice(kind);
    b.extend_from_slice(body);
    b
}

/// An ISOBMFF full box (version, no flags).
fn full(kind: &[u8; 4], version: u8, body: &[u8]) -> Vec<u8> {
    bx(kind, &[&[version, 0, 0, 0], body].concat())
}

/// A HEIC whose primary item is a `grid` of `rows` × `cols` tiles, every tile the one 160×120
/// HEVC image of tests/data/flat-160x120.heic (one coded image, each tile naming it); the grid
/// makes an `out`-sized image and its `ispe` says `said`.
pub fn heic_grid(rows: u8, cols: u8, out: (u16, u16), said: (u32, u32)) -> Vec<u8> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/flat-160x120.heic");
    let src = std::fs::read(path).unwrap();
    // The fixture's boxes (tests/data/README.md): its hvcC, ispe and pixi properties, and the
    // coded image in its mdat.
    let at = |kind: &[u8; 4], from: usize, len: usize| {
        assert_eq!(&src[from + 4..from + 8], kind);
        src[from..from + len].to_vec()
    };
    let (hvcc, tile, pixi) = (
        at(b"hvcC", 172, 120),
        at(b"ispe", 292, 20),
        at(b"pixi", 312, 16),
    );
    let hevc = src[358..429].to_vec();
    let tiles = u16::from(rows) * u16::from(cols);
    let infe = |id: u16, kind: &[u8; 4]| {
        full(
            b"infe",
            2,
            &[&id.to_be_bytes()[..], &[0, 0], kind, &[0]].concat(),
        )
    };
    let mut refs = [1u16.to_be_bytes(), tiles.to_be_bytes()].concat();
    for _ in 0..tiles {
        refs.extend_from_slice(&2u16.to_be_bytes());
    }
    let said = full(
        b"ispe",
        0,
        &[said.0.to_be_bytes(), said.1.to_be_bytes()].concat(),
    );
    let grid = [
        &[0, 0, rows - 1, cols - 1][..],
        &out.0.to_be_bytes(),
        &out.1.to_be_bytes(),
    ]
    .concat();
    // Grid item 1: the grid's ispe (property 4); tile item 2: hvcC (essential), ispe, pixi.
    let ipma = [
        &2u32.to_be_bytes()[..],
        &[0, 1, 1, 0x84],
        &[0, 2, 3, 0x81, 0x02, 0x83],
    ]
    .concat();
    let meta = |mdat_at: u32| {
        let data = mdat_at + 8;
        let extent = |id: u16, offset: u32, len: usize| {
            [
                &id.to_be_bytes()[..],
                &[0, 0],
                &data.to_be_bytes(),
                &[0, 1],
                &offset.to_be_bytes(),
                &(len as u32).to_be_bytes(),
            ]
            .concat()
        };
        let iloc = [
            &[0x44, 0x40, 0, 2][..],
            &extent(1, hevc.len() as u32, grid.len()),
            &extent(2, 0, hevc.len()),
        ]
        .concat();
        let body = [
            full(b"hdlr", 0, &[&[0; 4][..], b"pict", &[0; 13]].concat()),
            full(b"pitm", 0, &1u16.to_be_bytes()),
            full(
                b"iinf",
                0,
                &[
                    &2u16.to_be_bytes()[..],
                    &infe(1, b"grid"),
                    &infe(2, b"hvc1"),
                ]
                .concat(),
            ),
            full(b"iref", 0, &bx(b"dimg", &refs)),
            full(b"iloc", 0, &iloc),
            bx(
                b"iprp",
                &[
                    bx(
                        b"ipco",
                        &[hvcc.clone(), tile.clone(), pixi.clone(), said.clone()].concat(),
                    ),
                    full(b"ipma", 0, &ipma),
                ]
                .concat(),
            ),
        ]
        .concat();
        full(b"meta", 0, &body)
    };
    let ftyp = bx(b"ftyp", b"heic\0\0\0\0mif1heic");
    let head = [ftyp.clone(), meta(0)].concat();
    let head = [ftyp, meta(head.len() as u32)].concat();
    [head, bx(b"mdat", &[hevc, grid].concat())].concat()
}
