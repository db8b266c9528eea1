//! Content-aware cropping (`g:sm`, thumbor's `smart`): where a crop window of a given size
//! keeps the most of what a viewer looks at, modelled on libvips's `attention` strategy.
//!
//! ```text
//! source ─▶ sampled copy (≤ ANALYSIS_SIDE on the long side, a few samples per cell)
//!        ─▶ saliency per cell = edges (Laplacian of luma) + skin tones + saturation (× alpha)
//!        ─▶ summed-area table ─▶ the window (the crop, scaled) with the largest sum,
//!           ties to the one nearest the centre (a flat image crops like a centre crop)
//!        ─▶ back to source pixels
//! ```
//!
//! The cost is bounded whatever the source's size: at most `ANALYSIS_SIDE`² cells of at most
//! `SAMPLES`² samples each. Pure functions of the pixels; no parameter parsing here (the URL
//! grammars call [`attention`] or [`place`]).

use super::raster::Raster;

/// The long side of the analysed copy, in cells.
pub const ANALYSIS_SIDE: u32 = 256;
/// Samples per cell along each axis (a cell's colour is their mean).
const SAMPLES: u32 = 4;
/// A normalised skin tone (r, g, b over their length): smartcrop.js's and libvips's
/// (0.78, 0.57, 0.44).
const SKIN: [f32; 3] = [0.749, 0.547, 0.422];

/// The top-left corner of the `crop_w`×`crop_h` window of `img` (clamped to its size) that
/// holds the most salient content.
pub fn attention(img: &Raster, crop_w: u32, crop_h: u32) -> (u32, u32) {
    let (w, h) = (img.width, img.height);
    if w == 0 || h == 0 {
        return (0, 0);
    }
    let (cw, ch) = (crop_w.clamp(1, w), crop_h.clamp(1, h));
    if (cw, ch) == (w, h) {
        return (0, 0);
    }
    let map = Saliency::of(img);
    // The window in cells, at least one.
    let aw = ((u64::from(cw) * u64::from(map.w)).div_ceil(u64::from(w)) as u32).clamp(1, map.w);
    let ah = ((u64::from(ch) * u64::from(map.h)).div_ceil(u64::from(h)) as u32).clamp(1, map.h);
    let (ax, ay, centred) = map.best_window(aw, ah);
    // Back to pixels: the window's centre is kept; a window as good as the centred one along an
    // axis is exactly a centre crop there.
    let to_px = |a: u32, span: u32, cells: u32, full: u32, crop: u32, centred: bool| -> u32 {
        if centred {
            return (full - crop) / 2;
        }
        let c = (f64::from(a) + f64::from(span) / 2.0) * f64::from(full) / f64::from(cells);
        let left = (c - f64::from(crop) / 2.0).round().max(0.0) as u32;
        left.min(full - crop)
    };
    (
        to_px(ax, aw, map.w, w, cw, centred.0),
        to_px(ay, ah, map.h, h, ch, centred.1),
    )
}

/// Moves `crop` (left, top, width, height in `img` pixels, as the transform pipeline plans it)
/// to where it holds the most salient content, keeping its size.
pub fn place(img: &Raster, crop: (f64, f64, f64, f64)) -> (f64, f64, f64, f64) {
    let (cw, ch) = (
        crop.2.min(f64::from(img.width)),
        crop.3.min(f64::from(img.height)),
    );
    let (x, y) = attention(img, cw.ceil() as u32, ch.ceil() as u32);
    // A fractional size may not quite reach the far edge at the rounded-up position.
    let x = f64::from(x).min(f64::from(img.width) - cw).max(0.0);
    let y = f64::from(y).min(f64::from(img.height) - ch).max(0.0);
    (x, y, cw, ch)
}

/// The saliency of each cell of the analysed copy, row by row.
struct Saliency {
    w: u32,
    h: u32,
    score: Vec<u32>,
}

impl Saliency {
    fn of(img: &Raster) -> Saliency {
        let (w, h) = (img.width, img.height);
        let cell = w.max(h).div_ceil(ANALYSIS_SIDE).max(1);
        let (sw, sh) = (w.div_ceil(cell), h.div_ceil(cell));
        // Mean colour (0..1) and coverage of each cell.
        let mut rgb = Vec::with_capacity((sw * sh) as usize);
        let mut alpha = Vec::with_capacity((sw * sh) as usize);
        let c = usize::from(img.channels);
        for cy in 0..sh {
            let (y0, y1) = (cy * cell, ((cy + 1) * cell).min(h));
            for cx in 0..sw {
                let (x0, x1) = (cx * cell, ((cx + 1) * cell).min(w));
                let mut sum = [0f32; 4];
                let mut n = 0f32;
                for y in spread(y0, y1) {
                    for x in spread(x0, x1) {
                        let i = (y as usize * w as usize + x as usize) * c;
                        let px = &img.data[i..i + c];
                        let (r, g, b, a) = match c {
                            1 => (px[0], px[0], px[0], 255),
                            3 => (px[0], px[1], px[2], 255),
                            _ => (px[0], px[1], px[2], px[3]),
                        };
                        for (s, v) in sum.iter_mut().zip([r, g, b, a]) {
                            *s += f32::from(v);
                        }
                        n += 1.0;
                    }
                }
                let k = 1.0 / (255.0 * n);
                rgb.push([sum[0] * k, sum[1] * k, sum[2] * k]);
                alpha.push(sum[3] * k);
            }
        }
        let luma: Vec<f32> = rgb
            .iter()
            .map(|p| 0.299 * p[0] + 0.587 * p[1] + 0.114 * p[2])
            .collect();
        let (wu, hu) = (sw as usize, sh as usize);
        let at = |x: usize, y: usize| luma[y * wu + x];
        let mut score = Vec::with_capacity(wu * hu);
        for y in 0..hu {
            for x in 0..wu {
                let l = at(x, y);
                // 4-neighbour Laplacian, edges repeated.
                let lap = 4.0 * l
                    - at(x.saturating_sub(1), y)
                    - at((x + 1).min(wu - 1), y)
                    - at(x, y.saturating_sub(1))
                    - at(x, (y + 1).min(hu - 1));
                let edge = (lap.abs() * 4.0).min(1.0);
                let p = rgb[y * wu + x];
                let s = 1.8 * skin(p, l) + 0.6 * saturation(p, l) + edge;
                score.push((s * alpha[y * wu + x] * 1000.0) as u32);
            }
        }
        Saliency {
            w: sw,
            h: sh,
            score,
        }
    }

    /// The top-left cell of the `aw`×`ah` window with the largest total, ties to the centre;
    /// and, per axis, whether the centred position (either of the two middle cells) holds as
    /// much.
    fn best_window(&self, aw: u32, ah: u32) -> (u32, u32, (bool, bool)) {
        let (w, h) = (self.w as usize, self.h as usize);
        // Summed-area table with a zero row and column in front.
        let mut sat = vec![0u64; (w + 1) * (h + 1)];
        for y in 0..h {
            let mut row = 0u64;
            for x in 0..w {
                row += u64::from(self.score[y * w + x]);
                sat[(y + 1) * (w + 1) + x + 1] = sat[y * (w + 1) + x + 1] + row;
            }
        }
        let (aw, ah) = (aw as usize, ah as usize);
        let total = |x: usize, y: usize| {
            let s = |x: usize, y: usize| sat[y * (w + 1) + x];
            s(x + aw, y + ah) + s(x, y) - s(x + aw, y) - s(x, y + ah)
        };
        // Twice the distance from the centred window, per axis (integers, no rounding ties).
        let off = |a: usize, span: usize, full: usize| (2 * a + span).abs_diff(full) as u64;
        let mut best = (0usize, 0usize);
        let mut best_key = (0u64, u64::MAX);
        for y in 0..=h - ah {
            for x in 0..=w - aw {
                let d = off(x, aw, w).pow(2) + off(y, ah, h).pow(2);
                let key = (total(x, y), d);
                if key.0 > best_key.0 || (key.0 == best_key.0 && key.1 < best_key.1) {
                    best_key = key;
                    best = (x, y);
                }
            }
        }
        let mid = |full: usize, span: usize| [(full - span) / 2, (full - span).div_ceil(2)];
        let centred_x = mid(w, aw).iter().any(|&x| total(x, best.1) == best_key.0);
        let centred_y = mid(h, ah).iter().any(|&y| total(best.0, y) == best_key.0);
        (best.0 as u32, best.1 as u32, (centred_x, centred_y))
    }
}

/// Up to `SAMPLES` coordinates spread evenly over `a..b` (b > a).
fn spread(a: u32, b: u32) -> impl Iterator<Item = u32> {
    let n = (b - a).min(SAMPLES);
    (0..n).map(move |i| a + (2 * i + 1) * (b - a) / (2 * n))
}

/// How much a colour (`p`, 0..1, luma `l`) looks like skin: 1 on the tone, 0 beyond a distance
/// of 0.1 from it (as directions in RGB), and only at a middle lightness.
fn skin(p: [f32; 3], l: f32) -> f32 {
    let len = (p[0] * p[0] + p[1] * p[1] + p[2] * p[2]).sqrt();
    if len < 1e-3 || !(0.2..=0.95).contains(&l) {
        return 0.0;
    }
    let d = p
        .iter()
        .zip(SKIN)
        .map(|(&c, s)| (c / len - s).powi(2))
        .sum::<f32>()
        .sqrt();
    (1.0 - d / 0.1).max(0.0)
}

/// Saturation (HSL), counted only where it is strong and the colour neither near black nor
/// near white.
fn saturation(p: [f32; 3], l: f32) -> f32 {
    let (max, min) = (p[0].max(p[1]).max(p[2]), p[0].min(p[1]).min(p[2]));
    let light = (max + min) / 2.0;
    if max - min < 1e-3 || !(0.05..=0.9).contains(&l) {
        return 0.0;
    }
    let s = (max - min) / (1.0 - (2.0 * light - 1.0).abs()).max(1e-3);
    ((s - 0.4) / 0.6).clamp(0.0, 1.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `w`×`h` flat grey-blue background with a `sw`×`sh` subject at (`sx`, `sy`): a skin-toned
    /// disc with dark, saturated red stripes (edges, skin and saturation all at once).
    fn scene(w: u32, h: u32, subject: (u32, u32, u32, u32)) -> Raster {
        let (sx, sy, sw, sh) = subject;
        let mut data = Vec::with_capacity((w * h * 3) as usize);
        for y in 0..h {
            for x in 0..w {
                let inside = x >= sx && x < sx + sw && y >= sy && y < sy + sh;
                let px = if !inside {
                    [150, 160, 170]
                } else if ((x - sx) / 4 + (y - sy) / 4) % 3 == 0 {
                    [200, 20, 30]
                } else {
                    [224, 170, 130]
                };
                data.extend_from_slice(&px);
            }
        }
        Raster {
            width: w,
            height: h,
            channels: 3,
            data,
        }
    }

    fn contains(window: (u32, u32, u32, u32), subject: (u32, u32, u32, u32)) -> bool {
        window.0 <= subject.0
            && window.1 <= subject.1
            && window.0 + window.2 >= subject.0 + subject.2
            && window.1 + window.3 >= subject.1 + subject.3
    }

    #[test]
    fn keeps_an_off_centre_subject_a_centre_crop_cuts() {
        let subject = (20, 180, 60, 50);
        let img = scene(400, 250, subject);
        let (cw, ch) = (150, 150);
        let centre = ((400 - cw) / 2, (250 - ch) / 2, cw, ch);
        assert!(
            !contains(centre, subject),
            "the test needs a centre crop to cut"
        );
        let (x, y) = attention(&img, cw, ch);
        assert!(
            contains((x, y, cw, ch), subject),
            "window at ({x}, {y}) cuts the subject"
        );
        // The subject in the top-right corner of a portrait image.
        let subject = (170, 10, 40, 40);
        let img = scene(220, 500, subject);
        let (x, y) = attention(&img, 220, 120);
        assert!(contains((x, y, 220, 120), subject), "({x}, {y})");
    }

    #[test]
    fn a_flat_image_crops_at_the_centre() {
        let img = Raster {
            width: 300,
            height: 200,
            channels: 3,
            data: vec![90; 300 * 200 * 3],
        };
        assert_eq!(attention(&img, 100, 100), (100, 50));
        let r = place(&img, (0.0, 0.0, 150.0, 200.0));
        assert_eq!(r, (75.0, 0.0, 150.0, 200.0));
    }

    #[test]
    fn transparent_pixels_are_not_salient() {
        // A striped subject on the left, but fully transparent; an opaque one on the right.
        let mut img = scene(300, 100, (10, 20, 60, 60));
        let right = scene(300, 100, (230, 20, 60, 60));
        let mut rgba = Vec::new();
        for (i, (l, r)) in img
            .data
            .chunks_exact(3)
            .zip(right.data.chunks_exact(3))
            .enumerate()
        {
            let x = i as u32 % 300;
            let px = if x < 150 { l } else { r };
            rgba.extend_from_slice(px);
            rgba.push(if x < 150 { 0 } else { 255 });
        }
        img.data = rgba;
        img.channels = 4;
        let (x, _) = attention(&img, 100, 100);
        assert!(x >= 190, "{x}");
    }

    #[test]
    fn large_sources_are_analysed_on_a_bounded_copy() {
        let img = scene(4000, 3000, (3300, 200, 500, 400));
        let map = Saliency::of(&img);
        assert!(map.w <= ANALYSIS_SIDE && map.h <= ANALYSIS_SIDE);
        let (x, y) = attention(&img, 1200, 1200);
        assert!(
            contains((x, y, 1200, 1200), (3300, 200, 500, 400)),
            "({x}, {y})"
        );
    }

    #[test]
    fn degenerate_sizes_do_not_panic() {
        let one = Raster {
            width: 1,
            height: 1,
            channels: 1,
            data: vec![7],
        };
        assert_eq!(attention(&one, 1, 1), (0, 0));
        assert_eq!(attention(&one, 0, 0), (0, 0));
        assert_eq!(attention(&one, 50, 50), (0, 0));
        let img = scene(37, 5, (30, 0, 5, 5));
        assert_eq!(attention(&img, 37, 5), (0, 0));
        let (x, y) = attention(&img, 1, 1);
        assert!(x < 37 && y < 5);
        let (x, _) = attention(&img, 10, 5);
        assert!(x + 10 <= 37 && x >= 25, "{x}");
        let tall = scene(3, 1000, (0, 900, 3, 50));
        let (_, y) = attention(&tall, 3, 100);
        assert!((850..=900).contains(&y), "{y}");
        assert_eq!(place(&one, (0.0, 0.0, 4.0, 4.0)), (0.0, 0.0, 1.0, 1.0));
    }
}
