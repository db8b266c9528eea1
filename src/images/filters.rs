//! Pixel filters of the image proxy's pipeline, each a pure function on a [`Raster`]: blur,
//! sharpen, pixelate, trim (finding a uniform border), canvas placement (extend and padding
//! onto a background), flattening alpha onto a colour, and watermark compositing.
//!
//! Every filter takes 1 (gray), 3 (RGB) or 4 (RGBA) channels, works in integers on whole rows
//! with scratch buffers allocated once per call (none per pixel), and keeps a flat image flat.

use crate::config::image_options::{Trim, Watermark, WatermarkPosition};

use super::raster::Raster;
use super::transform;

/// Above this sigma the Gaussian is approximated by three box blurs (running sums: a cost per
/// pixel independent of sigma), below it the kernel is exact (radius 3 sigma).
const EXACT_SIGMA: f32 = 8.0;

/// Fixed-point scale of the kernel weights (they sum to exactly this).
const ONE: u32 = 1 << 14;

/// Gaussian blur of standard deviation `sigma` (pixels), every channel.
pub fn blur(img: &Raster, sigma: f32) -> Raster {
    if sigma.is_nan() || sigma <= 0.0 || img.width == 0 || img.height == 0 {
        return img.clone();
    }
    let mut out = img.clone();
    if sigma <= EXACT_SIGMA {
        let kernel = gaussian_kernel(sigma);
        convolve_h(&mut out, &kernel);
        convolve_v(&mut out, &kernel);
    } else {
        for r in box_radii(sigma) {
            box_h(&mut out, r);
            box_v(&mut out, r);
        }
    }
    out
}

/// Integer Gaussian weights summing to exactly [`ONE`], radius ⌈3σ⌉.
fn gaussian_kernel(sigma: f32) -> Vec<u32> {
    let r = (3.0 * sigma).ceil().max(1.0) as i32;
    let w: Vec<f64> = (-r..=r)
        .map(|i| (-(f64::from(i * i)) / (2.0 * f64::from(sigma) * f64::from(sigma))).exp())
        .collect();
    let total: f64 = w.iter().sum();
    let mut k: Vec<u32> = w
        .iter()
        .map(|v| (v / total * f64::from(ONE)).round() as u32)
        .collect();
    // The rounding error goes to the centre, so that a flat image stays exactly flat.
    let sum: u32 = k.iter().sum();
    let mid = r as usize;
    k[mid] = (k[mid] + ONE).saturating_sub(sum);
    k
}

/// Radii of three boxes whose succession approximates a Gaussian of `sigma` (W. Jarosz).
fn box_radii(sigma: f32) -> [u32; 3] {
    let s = f64::from(sigma);
    let ideal = (12.0 * s * s / 3.0 + 1.0).sqrt();
    let mut wl = ideal.floor() as i64;
    if wl % 2 == 0 {
        wl -= 1;
    }
    let wu = wl + 2;
    let m = ((12.0 * s * s - 3.0 * (wl * wl) as f64 - 12.0 * wl as f64 - 9.0)
        / (-4.0 * wl as f64 - 4.0))
        .round() as i64;
    let mut out = [0u32; 3];
    for (i, o) in out.iter_mut().enumerate() {
        let w = if (i as i64) < m { wl } else { wu };
        *o = ((w - 1) / 2).max(1) as u32;
    }
    out
}

/// Horizontal pass: each row padded with its edge pixels into a scratch row; output sample
/// `j` is the weighted sum of `padded[j + i·c]`, so each tap is one pass over whole rows.
fn convolve_h(img: &mut Raster, k: &[u32]) {
    let c = usize::from(img.channels);
    let n = img.width as usize * c;
    let r = k.len() / 2;
    let mut padded = vec![0u8; n + 2 * r * c];
    let mut acc = vec![0u32; n];
    for row in img.data.chunks_exact_mut(n) {
        pad_row(row, &mut padded, r, c);
        acc.fill(ONE / 2);
        for (i, &wt) in k.iter().enumerate() {
            for (a, &s) in acc.iter_mut().zip(&padded[i * c..i * c + n]) {
                *a += wt * u32::from(s);
            }
        }
        for (d, &a) in row.iter_mut().zip(&acc) {
            *d = (a / ONE).min(255) as u8;
        }
    }
}

/// `row` into `padded` with `r` copies of its first and last pixels on either side.
fn pad_row(row: &[u8], padded: &mut [u8], r: usize, c: usize) {
    let n = row.len();
    padded[r * c..r * c + n].copy_from_slice(row);
    for i in 0..r {
        padded[i * c..(i + 1) * c].copy_from_slice(&row[..c]);
        padded[r * c + n + i * c..r * c + n + (i + 1) * c].copy_from_slice(&row[n - c..]);
    }
}

/// Vertical pass: each output row accumulates the weighted source rows (edge rows repeated),
/// whole rows at a time.
fn convolve_v(img: &mut Raster, k: &[u32]) {
    let stride = img.width as usize * usize::from(img.channels);
    let h = img.height as usize;
    let r = k.len() / 2;
    let src = img.data.clone();
    let mut acc = vec![0u32; stride];
    for y in 0..h {
        acc.fill(ONE / 2);
        for (i, &wt) in k.iter().enumerate() {
            let sy = (y + i).saturating_sub(r).min(h - 1);
            let srow = &src[sy * stride..(sy + 1) * stride];
            for (a, &s) in acc.iter_mut().zip(srow) {
                *a += wt * u32::from(s);
            }
        }
        for (d, &a) in img.data[y * stride..(y + 1) * stride].iter_mut().zip(&acc) {
            *d = (a / ONE).min(255) as u8;
        }
    }
}

/// A horizontal box blur of radius `r`, by running sums (each step adds a pixel, drops one).
fn box_h(img: &mut Raster, r: u32) {
    let c = usize::from(img.channels);
    let w = img.width as usize;
    let r = r as usize;
    let mut padded = vec![0u8; (w + 2 * r) * c];
    let n = 2 * r as u32 + 1;
    let mut sums = vec![0u32; c];
    for row in img.data.chunks_exact_mut(w * c) {
        pad_row(row, &mut padded, r, c);
        for (ch, s) in sums.iter_mut().enumerate() {
            *s = (0..=2 * r).map(|i| u32::from(padded[i * c + ch])).sum();
        }
        for x in 0..w {
            for ch in 0..c {
                row[x * c + ch] = ((sums[ch] + n / 2) / n) as u8;
                if x + 1 < w {
                    sums[ch] += u32::from(padded[(x + 2 * r + 1) * c + ch]);
                    sums[ch] -= u32::from(padded[x * c + ch]);
                }
            }
        }
    }
}

/// A vertical box blur of radius `r`, by running sums over whole rows.
fn box_v(img: &mut Raster, r: u32) {
    let stride = img.width as usize * usize::from(img.channels);
    let h = img.height as usize;
    let r = r as usize;
    let n = 2 * r as u32 + 1;
    let src = img.data.clone();
    let row = |y: isize| {
        let y = y.clamp(0, h as isize - 1) as usize;
        &src[y * stride..(y + 1) * stride]
    };
    let mut sums = vec![0u32; stride];
    for i in -(r as isize)..=(r as isize) {
        for (s, &v) in sums.iter_mut().zip(row(i)) {
            *s += u32::from(v);
        }
    }
    for y in 0..h {
        for (d, &s) in img.data[y * stride..(y + 1) * stride].iter_mut().zip(&sums) {
            *d = ((s + n / 2) / n) as u8;
        }
        let (add, drop) = (
            row(y as isize + r as isize + 1),
            row(y as isize - r as isize),
        );
        for ((s, &a), &d) in sums.iter_mut().zip(add).zip(drop) {
            *s = *s + u32::from(a) - u32::from(d);
        }
    }
}

/// libvips's `sharpen` defaults (as imgproxy's `sh` runs it), on luminance: the difference
/// between a pixel and its Gaussian blur of `sigma`, ignored below 2 L* (flat areas), tripled
/// above, the brightening bounded at 10 L* and the darkening at 20; added to every colour
/// channel alike (alpha untouched).
pub fn sharpen(img: &Raster, sigma: f32) -> Raster {
    if sigma.is_nan() || sigma <= 0.0 || img.width == 0 || img.height == 0 {
        return img.clone();
    }
    // libvips's L* units, in 0-255.
    const X1: i32 = 5; // 2 L*
    const M2: i32 = 3;
    const UP: i32 = 26; // 10 L*
    const DOWN: i32 = 51; // 20 L*
    let luma = img.to_gray();
    let luma = if luma.channels == 4 {
        Raster {
            channels: 1,
            data: luma.data.chunks_exact(4).map(|p| p[0]).collect(),
            ..luma
        }
    } else {
        luma
    };
    let soft = blur(&luma, sigma);
    let mut out = img.clone();
    let c = usize::from(img.channels);
    let colour = if c == 4 { 3 } else { c };
    for ((px, &l), &s) in out.data.chunks_exact_mut(c).zip(&luma.data).zip(&soft.data) {
        let d = i32::from(l) - i32::from(s);
        let y = (d.abs() - X1).max(0) * M2;
        let y = if d > 0 { y.min(UP) } else { -y.min(DOWN) };
        if y != 0 {
            for v in &mut px[..colour] {
                *v = (i32::from(*v) + y).clamp(0, 255) as u8;
            }
        }
    }
    out
}

/// Blocks of `size`×`size` pixels, each its average (summed in `u64`: a block over 4096² pixels
/// passes a `u32`).
pub fn pixelate(img: &Raster, size: u32) -> Raster {
    if size <= 1 || img.width == 0 || img.height == 0 {
        return img.clone();
    }
    let c = usize::from(img.channels);
    let (w, h, s) = (img.width as usize, img.height as usize, size as usize);
    let stride = w * c;
    let blocks = w.div_ceil(s);
    let mut sums = vec![0u64; blocks * c];
    let mut out = img.clone();
    for y0 in (0..h).step_by(s) {
        let y1 = (y0 + s).min(h);
        sums.fill(0);
        for row in img.data[y0 * stride..y1 * stride].chunks_exact(stride) {
            for (x, px) in row.chunks_exact(c).enumerate() {
                let b = x / s * c;
                for (sum, &v) in sums[b..b + c].iter_mut().zip(px) {
                    *sum += u64::from(v);
                }
            }
        }
        for row in out.data[y0 * stride..y1 * stride].chunks_exact_mut(stride) {
            for (x, px) in row.chunks_exact_mut(c).enumerate() {
                let bx = x / s;
                let n = ((bx * s + s).min(w) - bx * s) * (y1 - y0);
                let n = n as u64;
                for (v, &sum) in px.iter_mut().zip(&sums[bx * c..bx * c + c]) {
                    *v = ((sum + n / 2) / n) as u8;
                }
            }
        }
    }
    out
}

/// The region (left, top, width, height) left when the uniform border `t` describes is
/// removed; the whole image when there is none. A pixel is the border's when no channel
/// differs from the border colour by more than `t.threshold` (libvips's `find_trim`); the
/// colour is `t.color` (opaque) or the top-left pixel's (alpha included). `equal_hor` and
/// `equal_ver` cut the same amount from both sides (the smaller).
pub fn trim_box(img: &Raster, t: &Trim) -> (u32, u32, u32, u32) {
    let whole = (0, 0, img.width, img.height);
    if img.width == 0 || img.height == 0 {
        return whole;
    }
    let c = usize::from(img.channels);
    let bg: [u8; 4] = match (t.color, c) {
        (Some([r, g, b]), 1) => {
            let l = Raster {
                width: 1,
                height: 1,
                channels: 3,
                data: vec![r, g, b],
            }
            .to_gray()
            .data[0];
            [l, 0, 0, 0]
        }
        (Some([r, g, b]), _) => [r, g, b, 255],
        (None, _) => {
            let mut p = [0u8; 4];
            p[..c].copy_from_slice(&img.data[..c]);
            p
        }
    };
    let thr = t.threshold.max(0.0);
    let differs = |px: &[u8]| {
        px.iter()
            .zip(&bg)
            .any(|(&v, &b)| f64::from(v.abs_diff(b)) > thr)
    };
    let (w, h) = (img.width as usize, img.height as usize);
    let stride = w * c;
    let (mut left, mut right, mut top, mut bottom) = (w, 0usize, h, 0usize);
    for (y, row) in img.data.chunks_exact(stride).enumerate() {
        let mut pixels = row.chunks_exact(c);
        let Some(first) = pixels.position(differs) else {
            continue;
        };
        let last = w - 1 - row.chunks_exact(c).rev().position(differs).unwrap_or(0);
        left = left.min(first);
        right = right.max(last);
        top = top.min(y);
        bottom = y;
    }
    if top == h {
        return whole; // all border: nothing would be left, keep the image
    }
    if t.equal_hor {
        let m = left.min(w - 1 - right);
        (left, right) = (m, w - 1 - m);
    }
    if t.equal_ver {
        let m = top.min(h - 1 - bottom);
        (top, bottom) = (m, h - 1 - m);
    }
    (
        left as u32,
        top as u32,
        (right - left + 1) as u32,
        (bottom - top + 1) as u32,
    )
}

/// `img` placed on a `width`×`height` canvas at (`x`, `y`), the rest filled with `bg` (RGB;
/// None: transparent, the result RGBA). What falls outside the canvas is cut. With `bg`, a
/// gray image stays gray on a gray colour (else RGB) and RGBA stays RGBA (the canvas opaque).
pub fn place(img: &Raster, width: u32, height: u32, x: u32, y: u32, bg: Option<[u8; 3]>) -> Raster {
    let (channels, fill): (u8, [u8; 4]) = match bg {
        None => (4, [0, 0, 0, 0]),
        Some([r, g, b]) if img.channels == 1 && r == g && g == b => (1, [r, 0, 0, 0]),
        Some([r, g, b]) => (img.channels.max(3), [r, g, b, 255]),
    };
    let c = usize::from(channels);
    let mut data = Vec::with_capacity(width as usize * height as usize * c);
    for _ in 0..width as usize * height as usize {
        data.extend_from_slice(&fill[..c]);
    }
    let mut out = Raster {
        width,
        height,
        channels,
        data,
    };
    let src = convert(img, channels);
    let cols = img.width.min(width.saturating_sub(x)) as usize;
    let rows = img.height.min(height.saturating_sub(y)) as usize;
    let (sstride, dstride) = (img.width as usize * c, width as usize * c);
    for r in 0..rows {
        let s = &src[r * sstride..r * sstride + cols * c];
        let d = (y as usize + r) * dstride + x as usize * c;
        out.data[d..d + cols * c].copy_from_slice(s);
    }
    out
}

/// `img`'s pixels with `channels` channels (1 stays 1; to 3 or 4 by repeating gray, adding
/// opaque alpha).
fn convert(img: &Raster, channels: u8) -> std::borrow::Cow<'_, [u8]> {
    match (img.channels, channels) {
        (a, b) if a == b => std::borrow::Cow::Borrowed(&img.data[..]),
        (_, 4) => std::borrow::Cow::Owned(img.to_rgba()),
        _ => std::borrow::Cow::Owned(img.to_rgb()),
    }
}

/// An RGBA image flattened onto `bg` (RGB out); other images unchanged.
pub fn flatten(img: &Raster, bg: [u8; 3]) -> Raster {
    if img.channels != 4 {
        return img.clone();
    }
    let mut data = Vec::with_capacity(img.data.len() / 4 * 3);
    for p in img.data.chunks_exact(4) {
        let a = u32::from(p[3]);
        for (i, &b) in bg.iter().enumerate() {
            data.push(((u32::from(p[i]) * a + u32::from(b) * (255 - a) + 127) / 255) as u8);
        }
    }
    Raster {
        channels: 3,
        data,
        ..*img
    }
}

/// An offset as the options write it: pixels when ≥ 1, a fraction of `size` when < 1.
fn offset(v: f64, size: u32) -> i64 {
    if v.abs() < 1.0 {
        (v * f64::from(size)).round() as i64
    } else {
        v.round() as i64
    }
}

/// `mark` composited over `img` as `wm` places it: scaled to `scale` of `img`'s width (height
/// in proportion), its alpha multiplied by `opacity`; anchored at `position` with the offsets
/// away from the anchored edges (added on a centred axis); `Replicate` tiles it from the
/// top-left corner with the offsets as the gaps.
pub fn watermark(img: &mut Raster, mark: &Raster, wm: &Watermark) {
    let opacity = (wm.opacity.clamp(0.0, 1.0) * 255.0).round() as u32;
    if opacity == 0 || mark.width == 0 || mark.height == 0 || img.width == 0 || img.height == 0 {
        return;
    }
    let mut rgba = Raster {
        data: mark.to_rgba(),
        channels: 4,
        ..*mark
    };
    if wm.scale > 0.0 {
        let w = (f64::from(img.width) * wm.scale).round().max(1.0);
        let h = (w * f64::from(mark.height) / f64::from(mark.width))
            .round()
            .max(1.0);
        let full = (0.0, 0.0, f64::from(mark.width), f64::from(mark.height));
        match transform::resize(rgba, full, (w as u32, h as u32)) {
            Ok(r) => rgba = r,
            Err(_) => return,
        }
    }
    let (iw, ih) = (i64::from(img.width), i64::from(img.height));
    let (mw, mh) = (i64::from(rgba.width), i64::from(rgba.height));
    let (ox, oy) = (offset(wm.x, img.width), offset(wm.y, img.height));
    use WatermarkPosition as P;
    let P::At(at) = wm.position else {
        let (sx, sy) = ((mw + ox.max(0)).max(1), (mh + oy.max(0)).max(1));
        for ty in (0..ih).step_by(sy as usize) {
            for tx in (0..iw).step_by(sx as usize) {
                composite(img, &rgba, tx, ty, opacity);
            }
        }
        return;
    };
    let (x, y) = at.anchor((iw - mw, ih - mh), (ox, oy));
    composite(img, &rgba, x, y, opacity);
}

/// The RGBA `mark` drawn over `img` with its top-left corner at (`x`, `y`) (cut at the edges),
/// its alpha scaled by `opacity` (0-255): "over" compositing, on gray, RGB or RGBA.
fn composite(img: &mut Raster, mark: &Raster, x: i64, y: i64, opacity: u32) {
    let c = usize::from(img.channels);
    let (iw, ih) = (i64::from(img.width), i64::from(img.height));
    let (mw, mh) = (i64::from(mark.width), i64::from(mark.height));
    let (x0, x1) = (x.max(0), (x + mw).min(iw));
    let (y0, y1) = (y.max(0), (y + mh).min(ih));
    if x0 >= x1 || y0 >= y1 {
        return;
    }
    for yy in y0..y1 {
        let mrow = ((yy - y) * mw) as usize * 4;
        let irow = (yy * iw) as usize * c;
        for xx in x0..x1 {
            let m = &mark.data[mrow + (xx - x) as usize * 4..][..4];
            let a = (u32::from(m[3]) * opacity + 127) / 255;
            if a == 0 {
                continue;
            }
            let p = &mut img.data[irow + xx as usize * c..][..c];
            let mix = |d: u8, s: u8, da: u32| -> u8 {
                // over: (s·a + d·da·(1−a)) / out_a, all in 0-255
                let out_a = a * 255 + da * (255 - a);
                let v = (u32::from(s) * a * 255 + u32::from(d) * da * (255 - a) + out_a / 2)
                    / out_a.max(1);
                v.min(255) as u8
            };
            match c {
                1 => {
                    let l = (u32::from(m[0]) * 299
                        + u32::from(m[1]) * 587
                        + u32::from(m[2]) * 114
                        + 500)
                        / 1000;
                    p[0] = mix(p[0], l as u8, 255);
                }
                _ => {
                    let da = if c == 4 { u32::from(p[3]) } else { 255 };
                    for (d, &s) in p[..3].iter_mut().zip(&m[..3]) {
                        *d = mix(*d, s, da);
                    }
                    if c == 4 {
                        p[3] = ((a * 255 + da * (255 - a) + 127) / 255) as u8;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::image_options::Compass;

    fn flat(w: u32, h: u32, px: &[u8]) -> Raster {
        Raster {
            width: w,
            height: h,
            channels: px.len() as u8,
            data: px.repeat((w * h) as usize),
        }
    }

    fn at(img: &Raster, x: u32, y: u32) -> &[u8] {
        let c = usize::from(img.channels);
        &img.data[(y * img.width + x) as usize * c..][..c]
    }

    fn set(img: &mut Raster, x: u32, y: u32, px: &[u8]) {
        let c = usize::from(img.channels);
        let i = (y * img.width + x) as usize * c;
        img.data[i..i + c].copy_from_slice(px);
    }

    /// Left half black, right half white.
    fn edge(w: u32, h: u32, channels: u8) -> Raster {
        let mut img = flat(w, h, &vec![0u8; channels as usize]);
        for y in 0..h {
            for x in w / 2..w {
                set(&mut img, x, y, &vec![255u8; channels as usize]);
            }
        }
        img
    }

    fn mean(img: &Raster) -> f64 {
        img.data.iter().map(|&v| f64::from(v)).sum::<f64>() / img.data.len() as f64
    }

    #[test]
    fn blur_keeps_flat_images_flat_and_the_mean() {
        for sigma in [0.5, 2.0, 20.0] {
            for px in [&[77u8][..], &[10, 200, 30], &[1, 2, 3, 128]] {
                let img = flat(33, 17, px);
                assert_eq!(blur(&img, sigma), img, "sigma {sigma}");
            }
            let img = edge(64, 8, 3);
            let b = blur(&img, sigma);
            assert!((mean(&b) - mean(&img)).abs() < 2.0, "sigma {sigma}");
            // the edge is softened: next to it, neither black nor white
            let v = at(&b, 31, 4)[0];
            assert!(v > 0 && v < 128, "sigma {sigma}: {v}");
            // far from the edge, a small sigma leaves the pixels alone
            if sigma < 5.0 {
                assert_eq!(at(&b, 0, 0), &[0, 0, 0]);
                assert_eq!(at(&b, 63, 7), &[255, 255, 255]);
            }
        }
        let img = edge(16, 16, 1);
        assert_eq!(blur(&img, 0.0), img);
        // a single bright pixel spreads symmetrically
        let mut dot = flat(9, 9, &[0]);
        set(&mut dot, 4, 4, &[255]);
        let b = blur(&dot, 1.0);
        assert_eq!(at(&b, 3, 4), at(&b, 5, 4));
        assert_eq!(at(&b, 4, 3), at(&b, 4, 5));
        assert!(at(&b, 4, 4)[0] > at(&b, 3, 4)[0]);
    }

    #[test]
    fn sharpen_increases_edge_contrast() {
        let soft = blur(&edge(40, 4, 3), 2.0);
        let sharp = sharpen(&soft, 1.0);
        let (d0, d1) = (at(&soft, 18, 1)[0], at(&soft, 21, 1)[0]);
        let (s0, s1) = (at(&sharp, 18, 1)[0], at(&sharp, 21, 1)[0]);
        assert!(
            s0 <= d0 && s1 >= d1 && (s1 - s0) > (d1 - d0),
            "{d0} {d1} / {s0} {s1}"
        );
        // flat areas are untouched, alpha too
        let img = flat(10, 10, &[50, 60, 70, 90]);
        assert_eq!(sharpen(&img, 2.0), img);
        let mut a = edge(20, 3, 4);
        for p in a.data.chunks_exact_mut(4) {
            p[3] = 100;
        }
        assert!(sharpen(&blur(&a, 1.5), 1.0)
            .data
            .chunks_exact(4)
            .all(|p| p[3] == 100));
    }

    #[test]
    fn pixelate_averages_blocks() {
        let mut img = flat(5, 3, &[0]);
        set(&mut img, 0, 0, &[100]);
        set(&mut img, 4, 2, &[90]);
        let p = pixelate(&img, 2);
        // block (0,0)-(1,1): 100/4; the last column's blocks are 1 wide
        assert_eq!(at(&p, 1, 1), &[25]);
        assert_eq!(at(&p, 4, 2), &[90]);
        assert_eq!(at(&p, 4, 1), &[0]);
        assert_eq!(at(&p, 2, 2), &[0]);
        let rgb = flat(7, 7, &[1, 2, 3]);
        assert_eq!(pixelate(&rgb, 3), rgb);
        assert_eq!(pixelate(&img, 1), img);
    }

    #[test]
    fn trim_finds_a_known_border() {
        // white, with a red 4x3 block at (5, 2); a near-white speck at (1, 1)
        let mut img = flat(12, 8, &[255, 255, 255]);
        for y in 2..5 {
            for x in 5..9 {
                set(&mut img, x, y, &[200, 0, 0]);
            }
        }
        set(&mut img, 1, 1, &[250, 250, 250]);
        let t = |threshold, color, equal_hor, equal_ver| Trim {
            threshold,
            color,
            equal_hor,
            equal_ver,
        };
        assert_eq!(trim_box(&img, &t(10.0, None, false, false)), (5, 2, 4, 3));
        // threshold 0: the speck counts
        assert_eq!(trim_box(&img, &t(0.0, None, false, false)), (1, 1, 8, 4));
        // equal sides: left 5 and right 3 → 3 each; top 2 and bottom 3 → 2 each
        assert_eq!(trim_box(&img, &t(10.0, None, true, true)), (3, 2, 6, 4));
        // a given colour: against black, everything is content
        assert_eq!(
            trim_box(&img, &t(10.0, Some([0, 0, 0]), false, false)),
            (0, 0, 12, 8)
        );
        // all border: the whole image
        assert_eq!(
            trim_box(&flat(4, 4, &[9]), &t(0.0, None, false, false)),
            (0, 0, 4, 4)
        );
        // a transparent border
        let mut a = flat(6, 6, &[0, 0, 0, 0]);
        set(&mut a, 2, 3, &[0, 0, 0, 255]);
        assert_eq!(trim_box(&a, &t(10.0, None, false, false)), (2, 3, 1, 1));
        let mut g = flat(6, 6, &[255]);
        set(&mut g, 4, 0, &[0]);
        assert_eq!(
            trim_box(&g, &t(10.0, Some([255, 255, 255]), false, false)),
            (4, 0, 1, 1)
        );
    }

    #[test]
    fn place_positions_exactly() {
        let img = flat(2, 2, &[10, 20, 30]);
        let p = place(&img, 5, 4, 2, 1, Some([1, 2, 3]));
        assert_eq!((p.width, p.height, p.channels), (5, 4, 3));
        for y in 0..4 {
            for x in 0..5 {
                let inside = (2..4).contains(&x) && (1..3).contains(&y);
                let want: &[u8] = if inside { &[10, 20, 30] } else { &[1, 2, 3] };
                assert_eq!(at(&p, x, y), want, "{x},{y}");
            }
        }
        // transparent: RGBA, the image opaque
        let p = place(&img, 3, 3, 1, 1, None);
        assert_eq!(p.channels, 4);
        assert_eq!(at(&p, 0, 0), &[0, 0, 0, 0]);
        assert_eq!(at(&p, 2, 2), &[10, 20, 30, 255]);
        // cut at the canvas's edge
        let p = place(&img, 3, 3, 2, 2, Some([0, 0, 0]));
        assert_eq!(at(&p, 2, 2), &[10, 20, 30]);
        // gray on gray stays gray; gray on a colour becomes RGB; RGBA keeps its alpha
        assert_eq!(
            place(&flat(1, 1, &[5]), 2, 1, 0, 0, Some([7, 7, 7])).data,
            vec![5, 7]
        );
        assert_eq!(
            place(&flat(1, 1, &[5]), 2, 1, 1, 0, Some([7, 8, 9])).data,
            vec![7, 8, 9, 5, 5, 5]
        );
        assert_eq!(
            place(&flat(1, 1, &[5, 6, 7, 8]), 2, 1, 0, 0, Some([1, 1, 1])).data,
            vec![5, 6, 7, 8, 1, 1, 1, 255]
        );
    }

    #[test]
    fn flatten_mixes_alpha_onto_the_colour() {
        let img = Raster {
            width: 3,
            height: 1,
            channels: 4,
            data: vec![200, 100, 0, 255, 200, 100, 0, 0, 200, 100, 0, 128],
        };
        let f = flatten(&img, [0, 0, 255]);
        assert_eq!(f.channels, 3);
        assert_eq!(f.data, vec![200, 100, 0, 0, 0, 255, 100, 50, 127]);
        let rgb = flat(2, 2, &[1, 2, 3]);
        assert_eq!(flatten(&rgb, [0, 0, 0]), rgb);
    }

    fn wm(position: WatermarkPosition, x: f64, y: f64, opacity: f64) -> Watermark {
        Watermark {
            opacity,
            position,
            x,
            y,
            scale: 0.0,
        }
    }

    /// Where `mark` (opaque white, 2x2) lands on a black 8x6 image.
    fn lands(w: &Watermark) -> (u32, u32) {
        let mut img = flat(8, 6, &[0, 0, 0]);
        watermark(&mut img, &flat(2, 2, &[255, 255, 255]), w);
        let hits: Vec<(u32, u32)> = (0..6)
            .flat_map(|y| (0..8).map(move |x| (x, y)))
            .filter(|&(x, y)| at(&img, x, y)[0] > 0)
            .collect();
        assert_eq!(hits.len(), 4, "{w:?}");
        hits[0]
    }

    #[test]
    fn watermark_lands_at_each_position() {
        use WatermarkPosition as P;
        let cases = [
            (P::At(Compass::NorthWest), (0, 0)),
            (P::At(Compass::North), (3, 0)),
            (P::At(Compass::NorthEast), (6, 0)),
            (P::At(Compass::West), (0, 2)),
            (P::At(Compass::Center), (3, 2)),
            (P::At(Compass::East), (6, 2)),
            (P::At(Compass::SouthWest), (0, 4)),
            (P::At(Compass::South), (3, 4)),
            (P::At(Compass::SouthEast), (6, 4)),
        ];
        for (p, want) in cases {
            assert_eq!(lands(&wm(p, 0.0, 0.0, 1.0)), want, "{p:?}");
        }
        // offsets away from the anchored edges, added on a centred axis, fractions of the size
        assert_eq!(lands(&wm(P::At(Compass::NorthWest), 1.0, 2.0, 1.0)), (1, 2));
        assert_eq!(lands(&wm(P::At(Compass::SouthEast), 1.0, 2.0, 1.0)), (5, 2));
        assert_eq!(lands(&wm(P::At(Compass::Center), 1.0, 1.0, 1.0)), (4, 3));
        assert_eq!(lands(&wm(P::At(Compass::NorthWest), 0.5, 0.0, 1.0)), (4, 0));
    }

    #[test]
    fn watermark_opacity_replicate_and_scale() {
        use WatermarkPosition as P;
        let mut img = flat(4, 4, &[0, 0, 0]);
        watermark(
            &mut img,
            &flat(1, 1, &[200, 100, 255]),
            &wm(P::At(Compass::NorthWest), 0.0, 0.0, 0.5),
        );
        assert_eq!(at(&img, 0, 0), &[100, 50, 128]);
        assert_eq!(at(&img, 1, 0), &[0, 0, 0]);
        // the mark's own alpha multiplies the opacity; on RGBA the result's alpha grows
        let mut img = flat(2, 1, &[0, 0, 0, 0]);
        watermark(
            &mut img,
            &flat(1, 1, &[255, 255, 255, 128]),
            &wm(P::At(Compass::West), 0.0, 0.0, 1.0),
        );
        assert_eq!(at(&img, 0, 0), &[255, 255, 255, 128]);
        // gray images take the mark's luma
        let mut g = flat(1, 1, &[0]);
        watermark(
            &mut g,
            &flat(1, 1, &[255, 0, 0]),
            &wm(P::At(Compass::Center), 0.0, 0.0, 1.0),
        );
        assert_eq!(g.data, vec![76]);
        // replicate: tiles from the corner, offsets as gaps
        let mut img = flat(7, 3, &[0, 0, 0]);
        watermark(
            &mut img,
            &flat(2, 1, &[255, 255, 255]),
            &wm(P::Replicate, 1.0, 0.0, 1.0),
        );
        let row: Vec<u8> = (0..7).map(|x| at(&img, x, 1)[0]).collect();
        assert_eq!(row, vec![255, 255, 0, 255, 255, 0, 255]);
        // scale: the mark's width a fraction of the image's, height in proportion
        let mut img = flat(20, 20, &[0, 0, 0]);
        let w = Watermark {
            scale: 0.5,
            ..wm(P::At(Compass::NorthWest), 0.0, 0.0, 1.0)
        };
        watermark(&mut img, &flat(4, 2, &[255, 255, 255]), &w);
        let lit = img.data.chunks_exact(3).filter(|p| p[0] == 255).count();
        assert_eq!(lit, 10 * 5);
        assert_eq!(at(&img, 9, 4), &[255, 255, 255]);
        assert_eq!(at(&img, 10, 4), &[0, 0, 0]);
        // opacity 0: nothing
        let mut img = flat(2, 2, &[9, 9, 9]);
        watermark(
            &mut img,
            &flat(1, 1, &[255, 255, 255]),
            &wm(P::At(Compass::Center), 0.0, 0.0, 0.0),
        );
        assert_eq!(img, flat(2, 2, &[9, 9, 9]));
    }
}
