//! Build facts for `larder --version`: the commit built (`git rev-parse --short HEAD`, "unknown"
//! outside a git checkout, as in a packaged source) and the build date (UTC; from
//! `SOURCE_DATE_EPOCH` when set, for reproducible builds). Re-run only when the checked-out
//! commit changes (`.git/HEAD` and the ref it points to), not on every build.

use std::path::PathBuf;
use std::process::Command;
use std::time::{SystemTime, UNIX_EPOCH};

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=SOURCE_DATE_EPOCH");
    let commit = commit().unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=LARDER_COMMIT={commit}");
    println!("cargo:rustc-env=LARDER_BUILD_DATE={}", build_date());
}

/// The package's directory, read when the script runs. (`env!` would be the directory the
/// script was compiled in: cargo reuses a compiled build script for another checkout of the
/// same package, and a clone since deleted then made every version "unknown".)
fn manifest_dir() -> PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_default()
}

/// `git` in the package's directory: its trimmed output, if it ran and succeeded.
fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .args(args)
        .current_dir(manifest_dir())
        .output()
        .ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    (out.status.success() && !text.trim().is_empty()).then(|| text.trim().to_string())
}

/// The short commit hash, with the files that say which commit is checked out watched. Only
/// when the package is itself a git checkout (`.git` is a directory, or a file in a worktree):
/// a packaged source inside some other repository says "unknown".
fn commit() -> Option<String> {
    if !manifest_dir().join(".git").exists() {
        return None;
    }
    // `--git-path` resolves both for a worktree (HEAD in its own directory, refs in the
    // common one) and for a plain checkout.
    let mut watched = vec!["HEAD".to_string(), "packed-refs".to_string()];
    if let Some(head_ref) = git(&["symbolic-ref", "-q", "HEAD"]) {
        watched.push(head_ref);
    }
    for name in watched {
        if let Some(path) = git(&["rev-parse", "--git-path", &name]) {
            let path = manifest_dir().join(path);
            if path.exists() {
                println!("cargo:rerun-if-changed={}", path.display());
            }
        }
    }
    git(&["rev-parse", "--short", "HEAD"])
}

/// YYYY-MM-DD (UTC) of `SOURCE_DATE_EPOCH`, or of now.
fn build_date() -> String {
    let secs = std::env::var("SOURCE_DATE_EPOCH")
        .ok()
        .and_then(|s| s.trim().parse::<i64>().ok())
        .unwrap_or_else(|| {
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs() as i64)
        });
    let (y, m, d) = civil_from_days(secs.div_euclid(86_400));
    format!("{y:04}-{m:02}-{d:02}")
}

/// The proleptic Gregorian date of a day count since 1970-01-01 (Howard Hinnant's
/// `civil_from_days`, public domain).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}
