//! The binary's command line: `larder check` on the example config and on bad configs, the
//! version line, the process log (colour, NO_COLOR, JSON, levels) and a listener's self-signed
//! certificate, with the real binary.

mod common;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{client_trusting, free_port, larder_command, Child, Tls};

fn check(text: &str) -> (bool, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.toml");
    std::fs::write(&path, text).unwrap();
    let out = larder_command().arg("check").arg(&path).output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout),
    )
}

#[test]
fn example_config_checks_ok() {
    // As its first line says, from the repository's root (its static route serves
    // examples/public, relative to the working directory).
    let out = larder_command()
        .args(["check", "larder.example.toml"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("ok (1 listener(s), 5 route(s))"));
}

#[test]
fn example_config_sets_every_documented_key() {
    // Parsing it through the library proves every key in the example is real and valid.
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/larder.example.toml"))
        .unwrap();
    let cfg = larder::config::Config::parse(&text, "example").unwrap();
    assert_eq!(cfg.cache.max_size.0, 256 << 20);
    assert_eq!(cfg.listeners[0].routes.len(), 5);
    let larder::config::HandlerConfig::Images(images) = &cfg.listeners[0].routes[3].handler else {
        panic!("the fourth route is the image server")
    };
    assert_eq!(images.decode_memory.0, 512 << 20);
    assert_eq!(images.max_upscale.0, 1.0);
    assert_eq!(images.max_avif_pixels.get(), 1920 * 1080);
    let larder::config::HandlerConfig::Push(push) = &cfg.listeners[0].routes[4].handler else {
        panic!("the fifth route is push")
    };
    assert_eq!(push.history.0, 100_000);
    assert_eq!(push.groups[0].max.map(|m| m.0), Some(1000));
}

/// larder.example.toml shows every setting docs/config.md documents (set, or commented out
/// with its default): each key of the reference's tables appears in it as `key =` or as a
/// table `[....key]`.
#[test]
fn example_config_shows_every_key_the_reference_lists() {
    let root = env!("CARGO_MANIFEST_DIR");
    let doc = std::fs::read_to_string(format!("{root}/docs/config.md")).unwrap();
    let example = std::fs::read_to_string(format!("{root}/larder.example.toml")).unwrap();
    let shown = |key: &str| {
        example.lines().any(|line| {
            let line = line.trim_start_matches([' ', '#']);
            let assigned = line
                .split([' ', '{', ',', '('])
                .any(|w| w == key || w.strip_suffix('=') == Some(key))
                && line.contains(&format!("{key} ="));
            let table = line.starts_with('[')
                && (line.split(']').next()).is_some_and(|t| t.ends_with(&format!(".{key}")));
            assigned || table
        })
    };
    let missing: Vec<&str> = doc
        .lines()
        .filter_map(|l| l.strip_prefix("| `")?.split_once("` |").map(|(k, _)| k))
        .filter(|k| {
            k.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        })
        .filter(|k| !shown(k))
        .collect();
    assert!(
        missing.is_empty(),
        "docs/config.md keys missing from larder.example.toml: {missing:?}"
    );
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
        // An image route needs originals from somewhere: `dir`, `origin` or `root`.
        (
            format!("{base}[listener.route.images]\nmax_pixels = 100\n"),
            "line 4",
            "needs one of `dir`",
        ),
        (
            format!("{base}[listener.route.images]\norigin = \"pool:nope\"\n"),
            "line 5",
            "images.origin",
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
    let out = larder_command()
        .arg("check")
        .arg("/nonexistent/larder.toml")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot read /nonexistent/larder.toml"));
}

/// larder with `args`, its address space bounded (2 GiB) and stopped after 10 s if it still
/// runs: (exit code, stderr and stdout).
fn run_bounded(args: &[&str]) -> (Option<i32>, String) {
    let out = Command::new("sh")
        .arg("-c")
        .arg("ulimit -v 2097152 && exec timeout 10 \"$@\"")
        .arg("sh")
        .arg(larder_command().get_program())
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout),
    )
}

/// `larder --config /dev/zero` read forever (3.4 GB at 4 s). What is not a regular file is
/// refused before a byte is read, and so is a file larger than 16 MiB.
#[test]
fn regression_a_config_that_is_not_a_file_or_too_large_is_refused() {
    for args in [
        &["--config", "/dev/zero"][..],
        &["check", "/dev/zero"],
        &["check", "/tmp"],
    ] {
        let (code, msg) = run_bounded(args);
        assert_eq!(code, Some(2), "{args:?}: {msg}");
        assert!(
            msg.contains(&format!("cannot read {}", args[1]))
                && msg.contains("a configuration is a file"),
            "{args:?}: {msg}"
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let big = dir.path().join("big.toml");
    let f = std::fs::File::create(&big).unwrap();
    f.set_len((16 << 20) + 1).unwrap();
    let (code, msg) = run_bounded(&["check", big.to_str().unwrap()]);
    assert_eq!(code, Some(2), "{msg}");
    assert!(msg.contains("larger than 16 MiB"), "{msg}");
}

/// An image route's `watermark` that did not exist was only a warning at start (every request
/// asking for the watermark then got 400), and its `root` was not checked at all (every
/// `local://` source 404): `check` and loading refuse both, naming the key and its line.
#[test]
fn regression_an_image_root_or_watermark_that_does_not_exist_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("mark.png");
    std::fs::write(&file, "x").unwrap();
    let d = |p: &std::path::Path| format!("{:?}", p.display().to_string());
    let l = "[[listener]]\naddr = \"127.0.0.1:18080\"\n[[listener.route]]\nrespond = {}\n";
    let nope = dir.path().join("nope");
    for (images, key, why) in [
        (format!("root = {}", d(&nope)), "root", "does not exist"),
        (format!("root = {}", d(&file)), "root", "is not a directory"),
        (
            format!("root = {}, watermark = {}", d(dir.path()), d(&nope)),
            "watermark",
            "does not exist",
        ),
        (
            format!("root = {}, watermark = {}", d(dir.path()), d(dir.path())),
            "watermark",
            "is not a file",
        ),
    ] {
        let text = format!("{l}[[listener.route]]\npath = \"/i\"\nimages = {{ {images} }}\n");
        let (ok, msg) = check(&text);
        assert!(!ok, "accepted:\n{text}");
        assert!(
            msg.contains(&format!("line 7, key `listener.route.images.{key}`"))
                && msg.contains(why),
            "{text}\n=> {msg}"
        );
    }
    let text = format!(
        "{l}[[listener.route]]\npath = \"/i\"\nimages = {{ root = {}, watermark = {} }}\n",
        d(dir.path()),
        d(&file)
    );
    let (ok, msg) = check(&text);
    assert!(ok, "{text}\n=> {msg}");
}

/// A static `root` that does not exist was accepted (and every request answered 404): `check`
/// and loading refuse it, naming the key and its line.
#[test]
fn regression_a_static_root_that_does_not_exist_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("file");
    std::fs::write(&file, "x").unwrap();
    let l = "[[listener]]\naddr = \"127.0.0.1:18080\"\n[[listener.route]]\nrespond = {}\n";
    for (root, why) in [
        (dir.path().join("nope"), "does not exist"),
        (file, "is not a directory"),
    ] {
        let text = format!(
            "{l}[[listener.route]]\npath = \"/s\"\nstatic = {{ root = {:?} }}\n",
            root.display().to_string()
        );
        let (ok, msg) = check(&text);
        assert!(!ok, "accepted:\n{text}");
        assert!(
            msg.contains("line 7, key `listener.route.static.root`") && msg.contains(why),
            "{text}\n=> {msg}"
        );
    }
    // An existing directory is fine.
    let text = format!(
        "{l}[[listener.route]]\npath = \"/s\"\nstatic = {{ root = {:?} }}\n",
        dir.path().display().to_string()
    );
    let (ok, msg) = check(&text);
    assert!(ok, "{msg}");
}

/// larder with `args` (`{}` standing for the path of a file holding `text`), its open-files limit
/// (soft and hard) set to `nofile`, stopped after 20 s if it still runs: (exit code, stderr and
/// stdout).
fn run_limited(nofile: u32, args: &str, text: &str) -> (Option<i32>, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("larder.toml");
    std::fs::write(&path, text).unwrap();
    let args = args.replace("{}", "\"$1\"");
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "ulimit -n {nofile} && exec timeout 20 \"$0\" {args}"
        ))
        .arg(larder_command().get_program())
        .arg(&path)
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout),
    )
}

/// Values `larder check` used to accept and that broke only at runtime (a runaway thread count,
/// ports already taken, a head timeout of zero, a NaN fraction, a cache of zero bytes...): each
/// is refused, with the key's full path and its line.
#[test]
fn regression_check_accepts_values_that_break_at_runtime() {
    // Four lines: the listener and a route.
    let l = "[[listener]]\naddr = \"127.0.0.1:18080\"\n[[listener.route]]\nrespond = {}\n";
    let cases: Vec<(String, usize, &str)> = vec![
        (
            format!("[server]\nworkers = 100000000\n{l}"),
            2,
            "server.workers",
        ),
        (
            format!("[server]\nmax_header_size = \"1KiB\"\n{l}"),
            2,
            "server.max_header_size",
        ),
        (
            format!("[server]\nh2c = true\nheader_read_timeout = \"0s\"\n{l}"),
            3,
            "server.header_read_timeout",
        ),
        (
            format!("[cache]\nheuristic_fraction = -3.5\n{l}"),
            2,
            "cache.heuristic_fraction",
        ),
        (
            format!("[cache]\nheuristic_fraction = nan\n{l}"),
            2,
            "cache.heuristic_fraction",
        ),
        (format!("[cache]\nmax_size = 0\n{l}"), 2, "cache.max_size"),
        (
            format!("[cache]\nmax_size = \"1MiB\"\nmax_object_size = \"2MiB\"\n{l}"),
            3,
            "cache.max_object_size",
        ),
        (
            format!("[cache]\nmax_object_size = \"300MiB\"\n{l}"),
            2,
            "cache.max_object_size",
        ),
        (
            format!(
                "{l}[[listener]]\naddr = \"0.0.0.0:18080\"\n[[listener.route]]\nrespond = {{}}\n"
            ),
            6,
            "listener.addr",
        ),
        (
            format!("{l}[[listener]]\naddr = \"[::]:18080\"\n[[listener.route]]\nrespond = {{}}\n"),
            6,
            "listener.addr",
        ),
        (
            format!("[admin]\ntoken = \"t\"\nlisten = \"127.0.0.1:18080\"\n{l}"),
            3,
            "admin.listen",
        ),
        (
            format!("{l}[[listener.route]]\npath = \"/x\"\nrespond = {{ status = 1000 }}\n"),
            7,
            "listener.route.respond.status",
        ),
        (
            format!("[server]\nidle_timeout = \"99999999999999999h\"\n{l}"),
            2,
            "server.idle_timeout",
        ),
        (
            format!("{l}[[listener.route]]\npath = \"/s\"\nstatic = {{ index = [] }}\n"),
            7,
            "listener.route.static",
        ),
    ];
    for (text, line, key) in cases {
        let (ok, msg) = check(&text);
        assert!(!ok, "accepted:\n{text}");
        let want = format!("line {line}, key `{key}`");
        assert!(msg.contains(&want), "{text}\n=> {msg}\n(wanted {want})");
    }
}

/// `max_connections` above what the open-files limit allows made accept() fail with EMFILE
/// long before the bound engaged. Now `check` (and `run`) refuse it, naming the key and line,
/// after raising the soft limit; the default is lowered to fit instead.
#[test]
fn regression_max_connections_above_open_files_limit() {
    let l = "[[listener]]\naddr = \"127.0.0.1:18080\"\n[[listener.route]]\nrespond = {}\n";
    let too_many = format!("[server]\nmax_connections = 5000\n{l}");
    let (code, msg) = run_limited(1024, "check {}", &too_many);
    assert_eq!(code, Some(2), "{msg}");
    assert!(
        msg.contains("line 2, key `server.max_connections`") && msg.contains("1024"),
        "{msg}"
    );
    // Unset, the default (100000) is lowered to what the limit allows, and said so.
    let (code, msg) = run_limited(1024, "check {}", l);
    assert_eq!(code, Some(0), "{msg}");
    assert!(msg.contains("max_connections lowered"), "{msg}");
    // Run refuses it the same way, before binding anything.
    let (code, msg) = run_limited(1024, "--config {}", &too_many);
    assert_eq!(code, Some(2), "{msg}");
    assert!(
        msg.contains("line 2, key `server.max_connections`"),
        "{msg}"
    );
}

/// `--workers 100000000` started that many runtime workers: memory climbed and the port never
/// opened. The flag has the bound of the `workers` key.
#[test]
fn regression_workers_flag_is_bounded() {
    let args = "--workers 100000000 --upstream http://127.0.0.1:9 --listen 127.0.0.1:0";
    let (code, msg) = run_limited(1024, args, "");
    assert_eq!(code, Some(2), "{msg}");
    assert!(msg.contains("--workers") && msg.contains("1024"), "{msg}");
}

/// `larder --version` said `larder 0.1.0`: now the commit (a short hash here, in a git
/// checkout) and the build date (UTC) follow, as `larder 0.1.0 (abc1234 2026-11-27)`.
#[test]
fn version_names_the_commit_and_build_date() {
    let out = larder_command().arg("--version").output().unwrap();
    assert!(out.status.success());
    let line = String::from_utf8(out.stdout).unwrap();
    let inner = (line.trim())
        .strip_prefix(concat!("larder ", env!("CARGO_PKG_VERSION"), " ("))
        .and_then(|r| r.strip_suffix(')'))
        .unwrap_or_else(|| panic!("{line}"));
    let (commit, date) = inner.split_once(' ').unwrap_or_else(|| panic!("{line}"));
    assert!(
        commit.len() >= 7 && commit.bytes().all(|b| b.is_ascii_hexdigit()),
        "a commit-ish: {line}"
    );
    let parts: Vec<&str> = date.split('-').collect();
    assert!(
        parts.len() == 3
            && [4, 2, 2] == [parts[0].len(), parts[1].len(), parts[2].len()]
            && parts.iter().all(|p| p.bytes().all(|b| b.is_ascii_digit())),
        "a date: {line}"
    );
}

/// larder run by `sh -c` with the open-files limit at 1024 (so that the default
/// `max_connections` is lowered) and `env`, listening on `listen`, which the caller holds: it
/// logs its start and fails to bind, so it ends by itself. (exit code, stdout, stderr).
fn start_on_taken_port(
    shell: &str,
    listen: SocketAddr,
    args: &[&str],
    env: &[(&str, &str)],
) -> (Option<i32>, String, String) {
    let listen = listen.to_string();
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg(shell)
        .arg(larder_command().get_program())
        .args(["--upstream", "http://127.0.0.1:9", "--listen", &listen])
        .args(args)
        .env_remove("NO_COLOR")
        .env_remove("RUST_LOG");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

const LIMITED: &str = "ulimit -n 1024 && exec \"$0\" \"$@\"";

/// Colour escape codes went into redirected logs, and every start warned
/// `WARN max_connections lowered ...` for lowering a default (nothing to act on). Redirected,
/// the log has no ESC byte; the lowering is information; the fatal error says `error:`.
#[test]
fn regression_a_redirected_log_has_no_colour_and_a_default_start_no_warning() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let (code, out, err) = start_on_taken_port(LIMITED, taken.local_addr().unwrap(), &[], &[]);
    assert_eq!(code, Some(1), "{out}{err}");
    assert!(out.contains("max_connections lowered"), "{out}");
    for line in out.lines() {
        assert!(line.contains(" INFO "), "not information: {line}");
    }
    assert!(
        !out.contains('\x1b') && !err.contains('\x1b'),
        "{out:?}{err:?}"
    );
    assert!(err.starts_with("error: cannot listen on"), "{err}");
}

/// On a terminal the log is coloured, unless NO_COLOR is set (no-color.org). `script` gives
/// the process a terminal.
#[test]
fn no_color_turns_the_terminal_colours_off() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    // `script -qec CMD /dev/null`: CMD on a new terminal, its output relayed to ours.
    // (The binary's path and the arguments have no spaces.)
    let on_terminal = "exec script -qec \"ulimit -n 1024 && exec $0 $*\" /dev/null";
    let (code, out, err) = start_on_taken_port(on_terminal, taken.local_addr().unwrap(), &[], &[]);
    assert_eq!(code, Some(1), "{out}{err}");
    assert!(out.contains("\x1b["), "coloured on a terminal: {out:?}");
    let (code, out, err) = start_on_taken_port(
        on_terminal,
        taken.local_addr().unwrap(),
        &[],
        &[("NO_COLOR", "1")],
    );
    assert_eq!(code, Some(1), "{out}{err}");
    assert!(out.contains("max_connections lowered"), "{out}");
    assert!(!out.contains('\x1b'), "{out:?}");
}

/// `--log-format json`: every line of the log is a JSON object with its level and message
/// (the operator's start notes included); `--log-level warn` leaves out the information.
#[test]
fn the_log_is_json_on_request_and_its_level_is_a_flag() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    let (code, out, err) = start_on_taken_port(LIMITED, addr, &["--log-format", "json"], &[]);
    assert_eq!(code, Some(1), "{out}{err}");
    let mut messages = Vec::new();
    for line in out.lines() {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        assert_eq!(v["level"], "INFO", "{line}");
        messages.push(v["fields"]["message"].as_str().unwrap().to_string());
    }
    assert!(
        messages
            .iter()
            .any(|m| m.contains("max_connections lowered")),
        "{messages:?}"
    );
    let (code, out, err) = start_on_taken_port(LIMITED, addr, &["--log-level", "warn"], &[]);
    assert_eq!(code, Some(1), "{out}{err}");
    assert_eq!(out, "", "no information at warn");
    // The flag wins over RUST_LOG; RUST_LOG alone is honoured.
    let (_, out, _) = start_on_taken_port(
        LIMITED,
        addr,
        &["--log-level", "info"],
        &[("RUST_LOG", "error")],
    );
    assert!(out.contains("max_connections lowered"), "{out}");
    let (_, out, _) = start_on_taken_port(LIMITED, addr, &[], &[("RUST_LOG", "error")]);
    assert_eq!(out, "");
    let (code, _, err) = start_on_taken_port(LIMITED, addr, &["--log-level", "loud"], &[]);
    assert_eq!(code, Some(2));
    assert!(err.contains("error: invalid value 'loud'"), "{err}");
}

/// A wrong type in the file said `expected i64` (Rust's word): it says what the file should
/// hold, and names no Rust type.
#[test]
fn regression_a_wrong_type_is_said_in_the_files_words() {
    let l = "[[listener]]\naddr = \"127.0.0.1:18080\"\n[[listener.route]]\nrespond = {}\n";
    for (text, want) in [
        (
            format!("[server]\nmax_connections = \"many\"\n{l}"),
            "line 2, key `server.max_connections`: invalid type: string \"many\", expected a whole number",
        ),
        (
            format!("[compression]\ntypes = \"text/*\"\n{l}"),
            "expected an array",
        ),
        (format!("server = 3\n{l}"), "expected a table"),
    ] {
        let (ok, msg) = check(&text);
        assert!(!ok, "{text}");
        assert!(msg.contains(want), "{text}\n=> {msg}");
        for rust in ["i64", "u64", "usize", "sequence", "struct"] {
            assert!(!msg.contains(rust), "{text}\n=> {msg}");
        }
    }
}

/// larder from `config` (a file in `dir`, where it runs), until it prints a line holding
/// `until`: the child (killed when dropped) and what it printed so far.
fn start_in(dir: &std::path::Path, config: &str, until: &str) -> (Child, String) {
    start_in_with(dir, config, &[], until)
}

/// [`start_in`] with more arguments.
fn start_in_with(
    dir: &std::path::Path,
    config: &str,
    args: &[&str],
    until: &str,
) -> (Child, String) {
    std::fs::write(dir.join("larder.toml"), config).unwrap();
    let mut child = larder_command()
        .args(["--config", "larder.toml"])
        .args(args)
        .current_dir(dir)
        .env_remove("RUST_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let child = Child(child);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            if tx.send(line.unwrap_or_default()).is_err() {
                return;
            }
        }
    });
    let mut said = String::new();
    // Bounded: a larder that never serves fails the test instead of hanging it.
    while let Ok(line) = rx.recv_timeout(Duration::from_secs(60)) {
        said.push_str(&line);
        said.push('\n');
        if line.contains(until) {
            return (child, said);
        }
    }
    panic!("larder did not start:\n{said}");
}

/// `--tls-self-signed` had no counterpart in the file (`self_signed` was an unknown key):
/// `self_signed = true` in `[listener.tls]` serves HTTPS with a certificate for localhost made
/// under ./larder-state/tls/, which a client told to trust it accepts.
#[tokio::test]
async fn a_listener_serves_a_self_signed_certificate_from_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let addr = free_port();
    let config = format!(
        "[[listener]]\naddr = \"{addr}\"\n  [listener.tls]\n  self_signed = true\n  \
         [[listener.route]]\n  respond = {{ body = \"pong\" }}\n"
    );
    let (_larder, said) = start_in(dir.path(), &config, "→");
    let pem = std::fs::read_to_string(dir.path().join("larder-state/tls/self-signed.pem"))
        .unwrap_or_else(|e| panic!("{e}\n{said}"));
    assert!(
        said.contains("self-signed certificate for localhost"),
        "{said}"
    );
    let tls = Tls::connect(addr, "localhost", client_trusting(&pem, &[b"http/1.1"]))
        .await
        .unwrap();
    let got = tls.get_all("localhost", &["/"], &[]).await;
    assert_eq!(got[0].status, 200);
    assert_eq!(&got[0].body[..], b"pong");
    drop(_larder);

    // It is the listener's only certificate: beside `cert` it is refused, naming the key.
    let (ok, msg) = check(
        "[[listener]]\naddr = \"127.0.0.1:18443\"\n[listener.tls]\ncert = \"c.pem\"\n\
         key = \"k.pem\"\nself_signed = true\n[[listener.route]]\nrespond = {}\n",
    );
    assert!(!ok);
    assert!(
        msg.contains("line 6, key `listener.tls.self_signed`"),
        "{msg}"
    );
    // And a listener with no certificate at all is told it is one of the choices.
    let (ok, msg) = check(
        "[[listener]]\naddr = \"127.0.0.1:18443\"\n[listener.tls]\nhttp2 = true\n\
         [[listener.route]]\nrespond = {}\n",
    );
    assert!(!ok);
    assert!(msg.contains("`self_signed = true`"), "{msg}");
}

/// With the admin API on, the start says where the dashboard is.
#[test]
fn the_dashboards_url_is_printed_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let (addr, admin) = (free_port(), free_port());
    let config = format!(
        "[admin]\nlisten = \"{admin}\"\ntoken = \"t\"\n[[listener]]\naddr = \"{addr}\"\n  \
         [[listener.route]]\n  respond = {{ body = \"pong\" }}\n"
    );
    let (_larder, said) = start_in(dir.path(), &config, "dashboard at");
    assert!(
        said.contains(&format!("dashboard at http://{admin}/_larder/dashboard")),
        "{said}"
    );
}

/// The quick start's `--state-dir`, `--log-format` and `--log-level` had no keys in the file:
/// `[server] state_dir`, `log_format` and `log_level` say the same, and a flag overrides its
/// key.
#[test]
fn state_dir_and_the_log_have_keys_in_the_file_and_flags_override_them() {
    let dir = tempfile::tempdir().unwrap();
    let addr = free_port();
    let config = format!(
        "[server]\nstate_dir = \"kept\"\nlog_format = \"json\"\nlog_level = \"info\"\n\
         [[listener]]\naddr = \"{addr}\"\n  [listener.tls]\n  self_signed = true\n  \
         [[listener.route]]\n  respond = {{ body = \"pong\" }}\n"
    );
    let (larder, said) = start_in(dir.path(), &config, "→");
    assert!(
        dir.path().join("kept/tls/self-signed.pem").exists(),
        "the certificate under state_dir: {said}"
    );
    assert!(!dir.path().join("larder-state").exists());
    for line in said.lines() {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        assert_eq!(v["level"], "INFO", "{line}");
    }
    drop(larder);

    // The flags win over the file's keys.
    let args = [
        "--log-format",
        "text",
        "--log-level",
        "info",
        "--state-dir",
        "other",
    ];
    let (_larder, said) = start_in_with(
        dir.path(),
        &config.replace("\"info\"", "\"error\""),
        &args,
        "→",
    );
    assert!(said.contains(" INFO ") && !said.contains("{\""), "{said}");
    assert!(
        dir.path().join("other/tls/self-signed.pem").exists(),
        "{said}"
    );
}

/// `larder probe` (the container image's HEALTHCHECK): exit 0 when the listener answers the
/// path with 2xx or 3xx, 1 (and why) when it answers otherwise or nothing listens.
#[tokio::test(flavor = "multi_thread")]
async fn probe_says_whether_a_running_larder_answers() {
    let larder = common::Larder::start(
        "[[listener]]\naddr = \"127.0.0.1:0\"\n[[listener.route]]\npath = \"/ping\"\nrespond = { body = \"pong\" }\n[[listener.route]]\npath = \"/down\"\nrespond = { status = 503 }\n",
    )
    .await;
    let probe = |path: &str, addr: SocketAddr| {
        larder_command()
            .args([
                "probe",
                "--addr",
                &addr.to_string(),
                "--path",
                path,
                "--timeout-ms",
                "2000",
            ])
            .output()
            .unwrap()
    };
    let addr = larder.addr;
    let (up, down) =
        tokio::task::spawn_blocking(move || (probe("/ping", addr), probe("/down", addr)))
            .await
            .unwrap();
    assert!(
        up.status.success(),
        "{}",
        String::from_utf8_lossy(&up.stderr)
    );
    assert!(String::from_utf8_lossy(&up.stdout).contains("200 OK"));
    assert_eq!(down.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&down.stderr).contains("503"));
    let closed = free_port();
    let nobody = tokio::task::spawn_blocking(move || probe("/ping", closed))
        .await
        .unwrap();
    assert_eq!(nobody.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&nobody.stderr).contains("cannot reach"));
}
