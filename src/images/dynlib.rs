//! Shared libraries loaded at run time (libjxl for JPEG XL output, libheif for HEIC sources):
//! opened by soname with `libloading` the first time a format needs them, never linked, so a
//! machine without their -dev packages builds larder and one without the libraries runs it
//! (the format is then refused with 415 naming the library). `jxl` and `heif` import it; it
//! imports only `raster` (the error).

use std::sync::OnceLock;

use super::raster::CodecError;

/// A library's entry points, loaded once per process by [`load`].
pub type Once<T> = OnceLock<Result<T, String>>;

/// The entry points `symbols` makes of the first of `sonames` that loads, the first time;
/// after, the same (or the same failure). A failure is [`CodecError::Unavailable`] for
/// `format`, naming `library`.
pub fn load<T>(
    cell: &'static Once<T>,
    sonames: &[&str],
    symbols: impl FnOnce(libloading::Library) -> Result<T, String>,
    format: &'static str,
    library: &'static str,
) -> Result<&'static T, CodecError> {
    cell.get_or_init(|| open(sonames).and_then(symbols))
        .as_ref()
        .map_err(|why| CodecError::Unavailable {
            format,
            library,
            why: why.clone(),
        })
}

/// Opens the first of `sonames` that loads; the error lists what was tried.
pub fn open(sonames: &[&str]) -> Result<libloading::Library, String> {
    let mut why = Vec::new();
    for name in sonames {
        // SAFETY: these libraries run no initialisers with preconditions of ours.
        match unsafe { libloading::Library::new(name) } {
            Ok(lib) => return Ok(lib),
            Err(e) => why.push(e.to_string()),
        }
    }
    Err(format!(
        "none of {} loads ({})",
        sonames.join(", "),
        why.join("; ")
    ))
}

/// Symbols of a loaded library, copied out as plain function pointers (the library is kept
/// alive beside them by the caller).
pub struct Symbols<'a>(pub &'a libloading::Library);

impl Symbols<'_> {
    /// The symbol `name` (NUL-terminated) as a `T`.
    ///
    /// # Safety
    /// `T` must be the function pointer type of the symbol's C declaration.
    pub unsafe fn get<T: Copy>(&self, name: &[u8]) -> Result<T, String> {
        // SAFETY: the caller vouches for `T`.
        unsafe { self.0.get::<T>(name) }.map(|s| *s).map_err(|e| {
            let shown = String::from_utf8_lossy(name.strip_suffix(b"\0").unwrap_or(name));
            format!("{shown}: {e}")
        })
    }
}
