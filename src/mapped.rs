//! Large stored bodies kept in memory files, so that a plain TCP socket can send them without
//! copying: [`map`] copies a body of at least [`min`] bytes into a sealed `memfd`, maps it
//! read-only and hands back a `Bytes` over the mapping (`Bytes::from_owner`), so the rest of
//! larder (ranges, compression, TLS, HTTP/2, the tiers' records) reads it as any other body. A
//! registry of the live mappings lets the socket writer ([`crate::socket::poll_send_zero_copy`])
//! find, from a slice's address alone, the memory file and offset it lies at ([`find`]) and
//! send it with `sendfile(2)`: the kernel hands the file's pages to the socket by reference
//! instead of copying them into socket buffers (docs/design.md "Large bodies without a copy").
//!
//! The mapping, its registration and the file descriptor live as long as the last `Bytes` over
//! them: a body evicted while a response is being sent stays mapped until that response lets go
//! of it, and pages already handed to the socket are held by the kernel (the file is sealed
//! against writes, so they never change). Each mapped body holds one descriptor; at most
//! [`max_files`] are held at once (beyond, bodies stay on the heap), and the open-files fit
//! counts them (`cache.zero_copy_files`).
//!
//! The two settings are process-wide (set once at start, [`configure`]), since an entry is
//! built in many places (fills, static files, images, records read back once memory keeps
//! them) that carry no cache settings.

use std::collections::BTreeMap;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::RwLock;

use bytes::Bytes;

/// Bodies this large and larger are mapped; 0: none are. The default of `cache.zero_copy_min`.
pub const DEFAULT_MIN: usize = 64 * 1024;
/// At most this many bodies mapped at once: the default of `cache.zero_copy_files`.
pub const DEFAULT_FILES: usize = 1024;

static MIN: AtomicUsize = AtomicUsize::new(DEFAULT_MIN);
static MAX_FILES: AtomicUsize = AtomicUsize::new(DEFAULT_FILES);
/// Mappings alive now (also the registry's length, read without its lock).
static LIVE: AtomicUsize = AtomicUsize::new(0);

/// Live mappings by start address: (length, memory file).
static REGISTRY: RwLock<BTreeMap<usize, (usize, RawFd)>> = RwLock::new(BTreeMap::new());

/// Sets the smallest body mapped (0: none) and how many may be mapped at once; for bodies
/// stored from now on.
pub fn configure(min: usize, max_files: usize) {
    MIN.store(min, Ordering::Relaxed);
    MAX_FILES.store(max_files, Ordering::Relaxed);
}

/// The smallest body [`map`] maps; 0 when off.
pub fn min() -> usize {
    MIN.load(Ordering::Relaxed)
}

/// How many bodies may be mapped at once.
pub fn max_files() -> usize {
    MAX_FILES.load(Ordering::Relaxed)
}

/// Bodies mapped now.
pub fn live() -> usize {
    LIVE.load(Ordering::Relaxed)
}

/// `body` in a memory file when it is at least [`min`] bytes long and not mapped already;
/// otherwise (or when the memory file cannot be made: no descriptor left, no memory, more than
/// [`max_files`] mapped) `body` itself.
pub fn map(body: Bytes) -> Bytes {
    let min = min();
    if min == 0 || body.len() < min || find(&body).is_some() || live() >= max_files() {
        return body;
    }
    match Mapping::new(&body) {
        Ok(m) => Bytes::from_owner(m),
        Err(e) => {
            tracing::debug!(error = %e, len = body.len(), "body kept on the heap");
            body
        }
    }
}

/// The memory file and the offset in it where `slice` lies, when it lies wholly inside one
/// mapping. Valid while the caller holds `slice` (its `Bytes` keeps the mapping alive).
pub fn find(slice: &[u8]) -> Option<(RawFd, u64)> {
    if LIVE.load(Ordering::Relaxed) == 0 || slice.is_empty() {
        return None;
    }
    let at = slice.as_ptr() as usize;
    let registry = REGISTRY.read().unwrap_or_else(|e| e.into_inner());
    let (&start, &(len, fd)) = registry.range(..=at).next_back()?;
    let offset = at - start;
    (offset + slice.len() <= len).then_some((fd, offset as u64))
}

/// A sealed memory file holding one body, mapped read-only; registered while it lives.
struct Mapping {
    ptr: *const u8,
    len: usize,
    file: OwnedFd,
}

// SAFETY: the mapping is read-only and never changes (the file is sealed against writes);
// `ptr` is only read, from any thread, while the mapping lives.
unsafe impl Send for Mapping {}
unsafe impl Sync for Mapping {}

impl Mapping {
    fn new(body: &[u8]) -> std::io::Result<Mapping> {
        let last_error = std::io::Error::last_os_error;
        // SAFETY: a NUL-terminated name and valid flags; the descriptor returned is owned here.
        let fd = unsafe {
            libc::memfd_create(
                c"larder-body".as_ptr(),
                libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
            )
        };
        if fd < 0 {
            return Err(last_error());
        }
        // SAFETY: `fd` was just returned by memfd_create and is owned by nothing else.
        let file = unsafe { OwnedFd::from_raw_fd(fd) };
        let mut written = 0;
        while written < body.len() {
            // SAFETY: the pointer and length lie inside `body`.
            let n =
                unsafe { libc::write(fd, body[written..].as_ptr().cast(), body.len() - written) };
            if n < 0 {
                let e = last_error();
                if e.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            written += n as usize;
        }
        let seals =
            libc::F_SEAL_WRITE | libc::F_SEAL_GROW | libc::F_SEAL_SHRINK | libc::F_SEAL_SEAL;
        // SAFETY: fcntl on an owned descriptor.
        if unsafe { libc::fcntl(fd, libc::F_ADD_SEALS, seals) } != 0 {
            return Err(last_error());
        }
        // SAFETY: a read-only shared mapping of the whole file, which is `body.len()` bytes
        // (written above) and can no longer change size.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                body.len(),
                libc::PROT_READ,
                libc::MAP_SHARED,
                fd,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(last_error());
        }
        let ptr = ptr as *const u8;
        let mut registry = REGISTRY.write().unwrap_or_else(|e| e.into_inner());
        registry.insert(ptr as usize, (body.len(), fd));
        LIVE.store(registry.len(), Ordering::Relaxed);
        Ok(Mapping {
            ptr,
            len: body.len(),
            file,
        })
    }
}

impl AsRef<[u8]> for Mapping {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: `ptr` maps `len` readable bytes for as long as `self` lives.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        {
            let mut registry = REGISTRY.write().unwrap_or_else(|e| e.into_inner());
            registry.remove(&(self.ptr as usize));
            LIVE.store(registry.len(), Ordering::Relaxed);
        }
        // SAFETY: the mapping made in `new`, no longer reachable: this was its last owner.
        unsafe { libc::munmap(self.ptr as *mut libc::c_void, self.len) };
        debug_assert!(self.file.as_raw_fd() >= 0);
        // `file` is closed when dropped, after the mapping is gone from the registry.
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(len: usize) -> Bytes {
        Bytes::from((0..len).map(|i| (i % 251) as u8).collect::<Vec<u8>>())
    }

    /// A large body is mapped (same bytes, found with its offset), a small one is not; slices
    /// inside a mapping are found at their offset, slices reaching past it or outside it are
    /// not, and dropping the last handle unregisters it.
    #[test]
    fn slices_are_found_inside_their_mapping_only() {
        let large = body(DEFAULT_MIN + 5000);
        let mapped = map(large.clone());
        assert_eq!(mapped, large, "same bytes");
        assert_ne!(
            mapped.as_ptr(),
            large.as_ptr(),
            "copied into the memory file"
        );
        let (fd, off) = find(&mapped).expect("the whole body");
        assert_eq!(off, 0);
        let (fd2, off) = find(&mapped[100..200]).expect("a slice inside");
        assert_eq!((fd2, off), (fd, 100));
        let tail = mapped.slice(DEFAULT_MIN..);
        assert_eq!(find(&tail), Some((fd, DEFAULT_MIN as u64)));
        assert_eq!(find(&large), None, "the heap copy is not in a mapping");
        // A slice starting inside and ending past the mapping (as a pointer range).
        let past = unsafe { std::slice::from_raw_parts(mapped.as_ptr().add(10), mapped.len()) };
        assert_eq!(find(past), None);
        assert_eq!(find(&[]), None);

        let small = body(100);
        assert_eq!(map(small.clone()).as_ptr(), small.as_ptr(), "small stays");
        assert_eq!(map(mapped.clone()).as_ptr(), mapped.as_ptr(), "mapped once");

        let at = mapped.as_ptr() as usize;
        drop((mapped, tail));
        let registry = REGISTRY.read().unwrap();
        assert!(
            !registry.contains_key(&at),
            "unregistered with its last handle"
        );
    }

    /// The memory file holds the body's bytes (what sendfile reads) and is sealed.
    #[test]
    fn the_file_holds_the_body_and_is_sealed() {
        let large = body(DEFAULT_MIN * 2);
        let mapped = map(large.clone());
        let (fd, _) = find(&mapped).unwrap();
        let mut back = vec![0u8; large.len()];
        let n = unsafe { libc::pread(fd, back.as_mut_ptr().cast(), back.len(), 0) };
        assert_eq!(n as usize, large.len());
        assert_eq!(back, large);
        let n = unsafe { libc::pwrite(fd, b"x".as_ptr().cast(), 1, 0) };
        assert!(n < 0, "sealed against writes");
    }
}
