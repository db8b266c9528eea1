//! What surrounds the tests and the benchmarks: a test whose component is missing fails at once
//! naming `tests/provision`, the one command that installs them all (nothing installs from
//! inside `cargo test`); the Python modules under bench/ import no module that imports them
//! back (bench/lib/test_imports.py, run here so that `cargo test` checks it).

mod common;

use common::*;

/// The panic message of `f`, which must panic.
fn panic_of(f: impl FnOnce() + std::panic::UnwindSafe) -> String {
    let err = std::panic::catch_unwind(f).expect_err("a missing component panics");
    err.downcast_ref::<String>()
        .cloned()
        .or_else(|| err.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default()
}

/// A call of one of the bed's component finders.
type Find = Box<dyn FnOnce() + std::panic::UnwindSafe>;

#[test]
fn a_missing_component_fails_at_once_naming_the_command_that_installs_it() {
    let cases: Vec<(&str, Find)> = vec![
        (
            "larder-no-such-binary",
            Box::new(|| drop(apt("larder-no-such-binary", "larder-no-such-package"))),
        ),
        (
            "/nonexistent/larder-no-such-file",
            Box::new(|| drop(apt_file("/nonexistent/larder-no-such-file", "larder-none"))),
        ),
        (
            "example.org/larder-none@v0.0.0",
            Box::new(|| drop(go_install("example.org/larder-none@v0.0.0", "larder-none"))),
        ),
        (
            "larder-none@0.0.0",
            Box::new(|| drop(npm("larder-none", "0.0.0"))),
        ),
        (
            "larder-none==0.0.0",
            Box::new(|| drop(pip(&["larder-none==0.0.0"]))),
        ),
    ];
    for (what, f) in cases {
        let message = panic_of(f);
        assert!(
            message.contains(what) && message.contains("`tests/provision`"),
            "{what}: {message}"
        );
    }
}

#[test]
fn bench_modules_import_no_module_that_imports_them_back() {
    let python = apt("python3", "python3");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/bench/lib/test_imports.py");
    let out = std::process::Command::new(python)
        .arg(script)
        .output()
        .expect("run python3");
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
