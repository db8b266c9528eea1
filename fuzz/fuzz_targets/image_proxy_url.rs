//! libFuzzer target: `cargo +nightly fuzz run image_proxy_url`. The check lives in tests/fuzz_checks.
#![no_main]

#[path = "../../tests/fuzz_checks/mod.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::image_proxy_url(data));
