//! What decoding and encoding share, below the codecs: the pixels ([`Raster`]), the limits a
//! transform runs under ([`Limits`]) and why a codec failed ([`CodecError`]). A leaf: the
//! decoders (`codec`, `avif`) and the pipeline (`transform`) import it, it imports none of them.

/// Pixels in memory: 1 (gray), 3 (RGB) or 4 (RGBA) bytes per pixel, rows packed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Raster {
    pub width: u32,
    pub height: u32,
    pub channels: u8,
    pub data: Vec<u8>,
}

impl Raster {
    /// Luma (BT.601) of each pixel; alpha is kept (as RGBA with equal channels).
    pub fn to_gray(&self) -> Raster {
        let luma = |p: &[u8]| {
            ((u32::from(p[0]) * 299 + u32::from(p[1]) * 587 + u32::from(p[2]) * 114 + 500) / 1000)
                as u8
        };
        match self.channels {
            1 => self.clone(),
            3 => Raster {
                data: self.data.chunks_exact(3).map(luma).collect(),
                channels: 1,
                ..*self
            },
            _ => Raster {
                data: self
                    .data
                    .chunks_exact(4)
                    .flat_map(|p| {
                        let l = luma(p);
                        [l, l, l, p[3]]
                    })
                    .collect(),
                ..*self
            },
        }
    }

    /// RGB, alpha composited over white.
    pub(super) fn to_rgb(&self) -> Vec<u8> {
        self.to_rgb_over([255; 3])
    }

    /// RGB, alpha composited over `bg`.
    pub(super) fn to_rgb_over(&self, bg: [u8; 3]) -> Vec<u8> {
        match self.channels {
            1 => self.data.iter().flat_map(|&l| [l, l, l]).collect(),
            3 => self.data.clone(),
            _ => self
                .data
                .chunks_exact(4)
                .flat_map(|p| {
                    let a = u32::from(p[3]);
                    let over = |c: u8, b: u8| {
                        ((u32::from(c) * a + u32::from(b) * (255 - a) + 127) / 255) as u8
                    };
                    [over(p[0], bg[0]), over(p[1], bg[1]), over(p[2], bg[2])]
                })
                .collect(),
        }
    }

    pub(super) fn to_rgba(&self) -> Vec<u8> {
        match self.channels {
            1 => self.data.iter().flat_map(|&l| [l, l, l, 255]).collect(),
            3 => self
                .data
                .chunks_exact(3)
                .flat_map(|p| [p[0], p[1], p[2], 255])
                .collect(),
            _ => self.data.clone(),
        }
    }

    pub(super) fn has_alpha(&self) -> bool {
        self.channels == 4 && self.data.chunks_exact(4).any(|p| p[3] != 255)
    }
}

/// Why an image could not be decoded or encoded.
#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    #[error("image has {pixels} pixels, more than the limit of {limit}")]
    TooManyPixels { pixels: u64, limit: u64 },
    #[error("image has {frames} frames, more than the limit of {limit}")]
    TooManyFrames { frames: u32, limit: u32 },
    #[error("animation has {pixels} pixels in all its frames, more than the limit of {limit}")]
    TooManyAnimationPixels { pixels: u64, limit: u64 },
    #[error("this transform needs about {need} bytes of memory, more than the route's decode_memory of {budget}")]
    OverMemoryBudget { need: u64, budget: u64 },
    #[error("cannot decode {0}: {1}")]
    Decode(&'static str, String),
    #[error("transforming {0} sources is not supported")]
    Unsupported(&'static str),
    /// A format whose shared library, loaded at run time, is not on this machine (415).
    #[error("{format} needs {library}, which cannot be loaded here: {why}")]
    Unavailable {
        format: &'static str,
        library: &'static str,
        why: String,
    },
    #[error("cannot encode {0}: {1}")]
    Encode(&'static str, String),
    #[error("{0}")]
    Internal(String),
}

/// Limits a transform runs under: the source's size and frames (checked here, from the header),
/// the output's, and AVIF's cost; and the route's encoding settings (AVIF's speed, progressive
/// JPEG).
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_pixels: u64,
    pub max_dim: u32,
    pub max_frames: u32,
    /// Largest scale factor applied to the source (1.0: never enlarged).
    pub max_upscale: f64,
    /// AVIF output's speed (1-10): rav1e's preset, libaom's cpu-used plus one.
    pub avif_speed: u8,
    /// The AV1 encoder for AVIF output.
    pub avif_encoder: crate::config::AvifEncoder,
    /// Largest AVIF output, in pixels.
    pub max_avif_pixels: u64,
    /// Most pixels of all an animation's frames together (width × height × frames).
    pub max_animation_pixels: u64,
    /// JPEG output is progressive (SOF2).
    pub jpeg_progressive: bool,
}

impl Limits {
    /// An image route's limits when its configuration sets none (docs/config.md; rav1e's
    /// fastest speed, the encoder `auto`): what tests and tools start from, naming only what
    /// they change (`Limits { max_frames: 1, ..Limits::DEFAULT }`). `images::tests` checks it
    /// against a route built from an empty configuration.
    pub const DEFAULT: Limits = Limits {
        max_pixels: 50_000_000,
        max_dim: 4096,
        max_frames: 100,
        max_upscale: 1.0,
        avif_speed: 10,
        avif_encoder: crate::config::AvifEncoder::Auto,
        max_avif_pixels: 2_073_600,
        max_animation_pixels: 100_000_000,
        jpeg_progressive: false,
    };
}
