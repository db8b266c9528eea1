//! The quick start's certificate (`--tls-self-signed`, `self_signed = true` in a listener's
//! `[listener.tls]`): one for localhost, 127.0.0.1 and ::1,
//! made once and kept in a state directory (0700; the key 0600), so that a client told to trust
//! it (`curl --cacert`) keeps trusting it across restarts.

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use super::Error;

/// The names the self-signed certificate is valid for.
const NAMES: [&str; 3] = ["localhost", "127.0.0.1", "::1"];

/// The certificate and key under `dir` (`self-signed.pem`, `self-signed.key`), made if they do
/// not exist yet. Returns their paths.
pub fn self_signed(dir: &Path) -> Result<(PathBuf, PathBuf), Error> {
    let cert = dir.join("self-signed.pem");
    let key = dir.join("self-signed.key");
    if cert.is_file() && key.is_file() {
        return Ok((cert, key));
    }
    let fail = |path: &Path, e: &dyn std::fmt::Display| Error::File {
        path: path.to_path_buf(),
        message: e.to_string(),
    };
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| fail(dir, &e))?;
    let made = rcgen::generate_simple_self_signed(NAMES.map(String::from).to_vec())
        .map_err(|e| fail(&cert, &e))?;
    let write = |path: &Path, mode: u32, text: String| {
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(mode)
            .open(path)
            .and_then(|mut f| f.write_all(text.as_bytes()))
            .map_err(|e| fail(path, &e))
    };
    write(&key, 0o600, made.signing_key.serialize_pem())?;
    write(&cert, 0o644, made.cert.pem())?;
    Ok((cert, key))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn made_once_with_private_permissions() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        let (cert, key) = self_signed(&state).unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&state), 0o700);
        assert_eq!(mode(&key), 0o600);
        let first = std::fs::read(&cert).unwrap();
        let (cert2, _) = self_signed(&state).unwrap();
        assert_eq!(std::fs::read(cert2).unwrap(), first, "kept, not made anew");
        let cfg = crate::config::CertConfig {
            cert,
            key,
            names: Vec::new(),
        };
        crate::tls::certs::load(&cfg, &crate::tls::provider()).expect("loads");
    }
}
