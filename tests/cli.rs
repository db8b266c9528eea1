//! The binary's command line: `larder check` on the example config and on bad configs, and the
//! embedded default serving a real request.

use std::process::Command;

fn larder() -> Command {
    Command::new(env!("CARGO_BIN_EXE_larder"))
}

fn check(text: &str) -> (bool, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.toml");
    std::fs::write(&path, text).unwrap();
    let out = larder().arg("check").arg(&path).output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout),
    )
}

#[test]
fn example_config_checks_ok() {
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/larder.example.toml");
    let out = larder().arg("check").arg(example).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("ok (1 listener(s), 4 route(s))"));
}

#[test]
fn example_config_sets_every_documented_key() {
    // Parsing it through the library proves every key in the example is real and valid.
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/larder.example.toml"))
        .unwrap();
    let cfg = larder::config::Config::parse(&text, "example").unwrap();
    assert_eq!(cfg.cache.max_size.0, 256 << 20);
    assert_eq!(cfg.listeners[0].routes.len(), 4);
    let larder::config::HandlerConfig::Images(images) = &cfg.listeners[0].routes[3].handler else {
        panic!("the fourth route is the image server")
    };
    assert_eq!(images.decode_memory.0, 512 << 20);
    assert_eq!(images.max_upscale.0, 1.0);
    assert_eq!(images.max_avif_pixels.get(), 1920 * 1080);
}

#[test]
fn unknown_key_is_named_with_its_line() {
    let (ok, msg) = check("[server]\nworkers = 1\nworkerz = 2\n");
    assert!(!ok);
    assert!(msg.contains("line 3") && msg.contains("workerz"), "{msg}");
}

#[test]
fn bad_values_are_named_with_their_line() {
    let base = "[[listener]]\naddr = \"127.0.0.1:1\"\n[[listener.route]]\n";
    let cases = [
        (
            format!("{base}proxy = {{ upstream = \"ftp://x\" }}\n"),
            "line 4",
            "proxy",
        ),
        (
            format!("[cache]\nmax_size = \"lots\"\n{base}respond = {{}}\n"),
            "line 2",
            "max_size",
        ),
        (
            format!("[server]\nidle_timeout = \"5 parsecs\"\n{base}respond = {{}}\n"),
            "line 2",
            "idle_timeout",
        ),
        (
            format!("{base}[listener.route.images]\ndir = \"/x\"\nmax_upscale = 0.5\n"),
            "line 6",
            "max_upscale",
        ),
        (
            "[[listener]]\naddr = \"not an address\"\n".to_string(),
            "line 2",
            "addr",
        ),
        (
            format!("{base}path = \"nope\"\nrespond = {{}}\n"),
            "line 4",
            "path",
        ),
    ];
    for (text, line, key) in cases {
        let (ok, msg) = check(&text);
        assert!(!ok, "{text}");
        assert!(msg.contains(line) && msg.contains(key), "{text}\n=> {msg}");
    }
}

#[test]
fn missing_file_is_a_clear_error() {
    let out = larder()
        .arg("check")
        .arg("/nonexistent/larder.toml")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot read /nonexistent/larder.toml"));
}
