//! larder installed as a service, with the real binary: its shell completions and man page,
//! systemd's notifications (READY once listening, WATCHDOG pings, RELOADING/READY around a
//! reload, STOPPING at SIGTERM) read from a datagram socket as systemd would, the PID file,
//! giving up root for `[server] user`, and the files dist/ ships (the unit, the Containerfile,
//! the Debian package's metadata).

mod common;

use std::io::{Read, Write};
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{free_port, larder_command, which, Child};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

fn stdout_of(args: &[&str]) -> String {
    let out = larder_command().args(args).output().unwrap();
    assert!(
        out.status.success(),
        "larder {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn completions_name_the_subcommands_and_flags() {
    let bash = stdout_of(&["completions", "bash"]);
    for word in [
        "check",
        "stats",
        "reload",
        "completions",
        "manpage",
        "--config",
        "--upstream",
    ] {
        assert!(bash.contains(word), "bash completion lacks {word}");
    }
    assert!(bash.contains("complete -F"), "a bash completion script");
    // bash loads it and completes `larder ch` to `check` with it.
    if let Some(shell) = which("bash") {
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("larder.bash");
        std::fs::write(&script, &bash).unwrap();
        let probe = "source \"$0\"; COMP_WORDS=(larder ch); COMP_CWORD=1; COMP_LINE='larder ch'; \
                     COMP_POINT=9; _larder larder ch larder; printf '%s\\n' \"${COMPREPLY[@]}\"";
        let out = Command::new(shell)
            .args(["-c", probe])
            .arg(&script)
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&out.stdout);
        assert!(
            said.lines().any(|l| l == "check"),
            "{said}{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let zsh = stdout_of(&["completions", "zsh"]);
    assert!(
        zsh.starts_with("#compdef larder"),
        "{}",
        &zsh[..80.min(zsh.len())]
    );
    let fish = stdout_of(&["completions", "fish"]);
    assert!(fish.contains("complete -c larder"));
    // An unknown shell is refused with the ones there are.
    let out = larder_command()
        .args(["completions", "tcsh"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("bash"));
}

#[test]
fn man_page_holds_the_options_and_renders() {
    let page = stdout_of(&["manpage"]);
    assert!(
        page.starts_with(".ie \\n(.g .ds Aq") || page.contains(".TH larder 1"),
        "{page:.200}"
    );
    assert!(page.contains(".TH larder 1"), "a section-1 page");
    for word in [
        "\\-\\-config",
        "\\-\\-upstream",
        "\\-\\-log\\-format",
        "completions",
        "manpage",
    ] {
        assert!(page.contains(word), "the page lacks {word}");
    }
    // Rendered by man itself, where it is installed.
    let Some(man) = which("man") else {
        eprintln!("man is not installed: the page was checked as roff only");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("larder.1");
    std::fs::write(&file, &page).unwrap();
    let out = Command::new(man)
        .args(["-P", "cat", "-l"])
        .arg(&file)
        .env("MANWIDTH", "100")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "man -l: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // man-db may render hyphens as U+2010; compare without them.
    let plain = text.replace(['\u{2010}', '\u{2212}'], "-");
    assert!(
        plain.contains("--config") && plain.contains("larder"),
        "{plain}"
    );
}

/// A socket where larder sends its notifications, as systemd's NOTIFY_SOCKET.
struct Notify {
    _dir: tempfile::TempDir,
    path: PathBuf,
    sock: UnixDatagram,
}

impl Notify {
    fn new() -> Notify {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let sock = UnixDatagram::bind(&path).unwrap();
        // Reachable by a larder that gave up root, as systemd's own socket is.
        use std::os::unix::fs::PermissionsExt;
        let open =
            |p: &Path, mode| std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode));
        open(dir.path(), 0o755).unwrap();
        open(&path, 0o777).unwrap();
        // A real wait on a datagram: a failing larder would otherwise hang the test.
        sock.set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        Notify {
            _dir: dir,
            path,
            sock,
        }
    }

    /// The datagrams up to and with the first that holds `line` (a whole line of it).
    fn until(&self, line: &str) -> Vec<String> {
        let mut seen = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            let n = match self.sock.recv(&mut buf) {
                Ok(n) => n,
                Err(e) => panic!("no {line} ({e}); got {seen:?}"),
            };
            let msg = String::from_utf8_lossy(&buf[..n]).into_owned();
            let found = msg.lines().any(|l| l == line);
            seen.push(msg);
            if found {
                return seen;
            }
        }
    }
}

/// A configuration answering "ok" on a free port, with `server` keys; (its directory, path,
/// address).
fn config(server: &str) -> (tempfile::TempDir, PathBuf, std::net::SocketAddr) {
    let dir = tempfile::tempdir().unwrap();
    let addr = free_port();
    let path = dir.path().join("larder.toml");
    let text = format!(
        "[server]\nworkers = 1\n{server}\n[[listener]]\naddr = \"{addr}\"\n[[listener.route]]\nrespond = {{ body = \"ok\" }}\n"
    );
    std::fs::write(&path, text).unwrap();
    (dir, path, addr)
}

/// Starts larder on `cfg` with NOTIFY_SOCKET (and WATCHDOG_USEC, with WATCHDOG_PID its own
/// process id as systemd sets it, when `watchdog` is given).
fn start(cfg: &Path, notify: &Notify, watchdog: Option<Duration>) -> Child {
    let mut cmd = Command::new("sh");
    let script = match watchdog {
        Some(d) => format!(
            "WATCHDOG_USEC={} WATCHDOG_PID=$$ exec \"$0\" \"$@\"",
            d.as_micros()
        ),
        None => "exec \"$0\" \"$@\"".to_string(),
    };
    cmd.arg("-c")
        .arg(script)
        .arg(larder_command().get_program())
        .arg("--config")
        .arg(cfg)
        .env("NOTIFY_SOCKET", &notify.path)
        .env_remove("WATCHDOG_USEC")
        .env_remove("WATCHDOG_PID")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    Child(cmd.spawn().unwrap())
}

/// A reload of an unchanged file, when flags override `[server]` keys (`--state-dir`,
/// `--log-format`, `--log-level`): nothing needs a restart. (The flags' values differed from the
/// file's, and the reload named `[server]` and the self-signed listener's `[listener.tls]`.)
#[test]
fn a_reload_keeps_what_the_flags_set() {
    let notify = Notify::new();
    let dir = tempfile::tempdir().unwrap();
    let addr = free_port();
    let cfg = dir.path().join("larder.toml");
    std::fs::write(
        &cfg,
        format!(
            "[[listener]]\naddr = \"{addr}\"\n  [listener.tls]\n  self_signed = true\n  \
             [[listener.route]]\n  respond = {{ body = \"ok\" }}\n"
        ),
    )
    .unwrap();
    let mut child = Child(
        larder_command()
            .arg("--config")
            .arg(&cfg)
            .args([
                "--state-dir",
                "kept",
                "--log-format",
                "json",
                "--log-level",
                "info",
            ])
            .current_dir(dir.path())
            .env("NOTIFY_SOCKET", &notify.path)
            .env_remove("RUST_LOG")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap(),
    );
    notify.until("READY=1");
    assert!(dir.path().join("kept/tls/self-signed.pem").exists());
    signal(&child, libc::SIGHUP);
    notify.until("RELOADING=1");
    notify.until("READY=1");
    signal(&child, libc::SIGTERM);
    let mut out = String::new();
    child
        .0
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    assert!(child.0.wait().unwrap().success());
    let reloaded: Vec<&str> = (out.lines())
        .filter(|l| l.contains("SIGHUP: configuration reloaded"))
        .collect();
    assert_eq!(reloaded.len(), 1, "{out}");
    assert!(!reloaded[0].contains("needs_restart"), "{}", reloaded[0]);
}

fn signal(child: &Child, sig: libc::c_int) {
    // SAFETY: a signal to our own child, which the Child guard keeps from being reaped.
    assert_eq!(unsafe { libc::kill(child.0.id() as libc::pid_t, sig) }, 0);
}

/// `GET /` on `addr`: the response's text.
fn get(addr: std::net::SocketAddr) -> String {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

#[test]
fn systemd_is_told_ready_watchdog_reloading_and_stopping() {
    let notify = Notify::new();
    let (_dir, cfg, addr) = config("");
    let mut child = start(&cfg, &notify, Some(Duration::from_millis(200)));
    let first = notify.until("READY=1");
    // Ready means listening.
    assert!(get(addr).ends_with("ok"));
    // Pings at half of WATCHDOG_USEC: two in a row arrive.
    notify.until("WATCHDOG=1");
    notify.until("WATCHDOG=1");
    // A reload (SIGHUP) is bracketed by RELOADING=1 (with the monotonic time) and READY=1.
    signal(&child, libc::SIGHUP);
    let reloading = notify.until("RELOADING=1");
    let msg = reloading.last().unwrap();
    assert!(msg.contains("MONOTONIC_USEC="), "{msg}");
    notify.until("READY=1");
    signal(&child, libc::SIGTERM);
    notify.until("STOPPING=1");
    let status = child.0.wait().unwrap();
    assert!(status.success(), "{status}");
    assert!(
        !first.iter().any(|m| m.contains("STOPPING")),
        "nothing before READY but READY: {first:?}"
    );
}

#[test]
fn without_a_watchdog_no_pings() {
    let notify = Notify::new();
    let (_dir, cfg, _addr) = config("");
    let child = start(&cfg, &notify, None);
    notify.until("READY=1");
    signal(&child, libc::SIGTERM);
    let rest = notify.until("STOPPING=1");
    assert!(
        !rest.iter().any(|m| m.contains("WATCHDOG")),
        "pinged with no WATCHDOG_USEC: {rest:?}"
    );
}

#[test]
fn pid_file_is_written_once_listening_and_removed_at_exit() {
    let notify = Notify::new();
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("larder.pid");
    let (_cfgdir, cfg, _addr) = config(&format!("pid_file = {:?}", pid_file.to_str().unwrap()));
    let mut child = start(&cfg, &notify, None);
    notify.until("READY=1");
    let text = std::fs::read_to_string(&pid_file).unwrap();
    assert_eq!(text, format!("{}\n", child.0.id()));
    signal(&child, libc::SIGTERM);
    assert!(child.0.wait().unwrap().success());
    assert!(!pid_file.exists(), "the PID file is removed at exit");
}

/// The ids of one `Uid:` or `Gid:` line of /proc/PID/status (real, effective, saved, fs).
fn ids(status: &str, key: &str) -> Vec<u32> {
    let line = (status.lines())
        .find(|l| l.starts_with(key))
        .unwrap_or_else(|| panic!("no {key} in {status}"));
    line[key.len()..]
        .split_whitespace()
        .map(|n| n.parse().unwrap())
        .collect()
}

#[test]
fn started_as_root_it_runs_as_the_configured_user() {
    // SAFETY: geteuid touches no memory.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("not run as root: the drop to [server] user cannot be tested here");
        return;
    }
    let nobody = larder::config::lookup_user("nobody").expect("a user nobody");
    let notify = Notify::new();
    let (_dir, cfg, addr) = config("user = \"nobody\"");
    let child = start(&cfg, &notify, None);
    notify.until("READY=1");
    let status = std::fs::read_to_string(format!("/proc/{}/status", child.0.id())).unwrap();
    assert_eq!(ids(&status, "Uid:"), [nobody.uid; 4], "{status}");
    assert_eq!(ids(&status, "Gid:"), [nobody.gid; 4], "{status}");
    assert_eq!(ids(&status, "Groups:"), [nobody.gid], "{status}");
    // Every thread, not only the main one.
    for task in std::fs::read_dir(format!("/proc/{}/task", child.0.id())).unwrap() {
        let s = std::fs::read_to_string(task.unwrap().path().join("status")).unwrap();
        assert_eq!(ids(&s, "Uid:"), [nobody.uid; 4], "{s}");
    }
    // Still serving on the port bound as root.
    assert!(get(addr).ends_with("ok"));
}

/// Root that cannot change user (CAP_SETUID and CAP_SETGID taken out of its bounding set by
/// setpriv, from util-linux): larder binds, fails to give up root, and exits rather than serve
/// as root.
#[test]
fn root_that_cannot_change_user_does_not_run_on() {
    // SAFETY: geteuid touches no memory.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("not run as root: the refused drop cannot be tested here");
        return;
    }
    let setpriv = common::apt("setpriv", "util-linux");
    let (_dir, cfg, addr) = config("user = \"nobody\"");
    // Bounded: a larder that ran on would be stopped after 20 s (exit code 124).
    let out = Command::new("timeout")
        .arg("20")
        .arg(setpriv)
        .args(["--bounding-set=-setuid,-setgid", "--"])
        .arg(larder_command().get_program())
        .arg("--config")
        .arg(&cfg)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("cannot change to user `nobody`") && err.contains("does not run on as root"),
        "{err}"
    );
    // It stopped: the port is free again.
    assert!(std::net::TcpListener::bind(addr).is_ok());
}

#[test]
fn a_user_or_group_that_does_not_exist_is_named_with_its_line() {
    let check = |server: &str| {
        let (_dir, cfg, _) = config(server);
        let out = larder_command().arg("check").arg(&cfg).output().unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (ok, msg) = check("user = \"no-such-larder-user\"");
    assert!(!ok);
    assert!(
        msg.contains("line 3, key `server.user`") && msg.contains("no user `no-such-larder-user`"),
        "{msg}"
    );
    let (ok, msg) = check("user = \"nobody\"\ngroup = \"no-such-larder-group\"");
    assert!(!ok);
    assert!(msg.contains("line 4, key `server.group`"), "{msg}");
    let (ok, msg) = check("group = \"nogroup\"");
    assert!(!ok);
    assert!(
        msg.contains("line 3, key `server.group`") && msg.contains("needs [server] user"),
        "{msg}"
    );
    let (ok, msg) = check("user = \"nobody\"");
    assert!(ok, "{msg}");
}

/// dist/larder.service: notify type with a watchdog, the directories and the hardening; and
/// `systemd-analyze verify` finds nothing to say of it, where systemd-analyze is installed.
#[test]
fn the_unit_is_a_notify_service_and_verifies() {
    let unit = std::fs::read_to_string(Path::new(ROOT).join("dist/larder.service")).unwrap();
    let lines: Vec<&str> = unit.lines().map(str::trim).collect();
    for want in [
        "Type=notify",
        "NotifyAccess=main",
        "ExecStart=/usr/bin/larder --config /etc/larder/larder.toml",
        "ExecReload=/bin/kill -HUP $MAINPID",
        "StateDirectory=larder",
        "CacheDirectory=larder",
        "ProtectSystem=strict",
        "NoNewPrivileges=yes",
        "PrivateTmp=yes",
        "CapabilityBoundingSet=CAP_NET_BIND_SERVICE",
        "AmbientCapabilities=CAP_NET_BIND_SERVICE",
        "ProtectClock=yes",
        "RestrictSUIDSGID=yes",
        "SystemCallFilter=@system-service",
    ] {
        assert!(lines.contains(&want), "the unit lacks {want}");
    }
    assert!(lines.iter().any(|l| l.starts_with("WatchdogSec=")));
    let Some(analyze) = which("systemd-analyze") else {
        eprintln!("systemd-analyze is not installed: the unit was not verified (a lint)");
        return;
    };
    // Verified with the binary built here in place of /usr/bin/larder (verify checks that
    // each command exists), and without looking for the man page (the package installs it).
    let dir = tempfile::tempdir().unwrap();
    let bin = larder_command().get_program().to_str().unwrap().to_string();
    let here = dir.path().join("larder.service");
    std::fs::write(&here, unit.replace("/usr/bin/larder", &bin)).unwrap();
    let out = Command::new(analyze)
        .args(["verify", "--man=no"])
        .arg(&here)
        .output()
        .unwrap();
    let said =
        String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{said}");
    // Unknown keys and bad values are only warnings: none may be said.
    assert_eq!(said.trim(), "", "systemd-analyze verify: {said}");
}

/// The instructions of a Containerfile: (instruction, its arguments), continuation lines
/// joined, comments left out.
fn instructions(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut pending = String::new();
    for line in text.lines() {
        let t = line.trim();
        if t.starts_with('#') || (t.is_empty() && pending.is_empty()) {
            continue;
        }
        if let Some(head) = t.strip_suffix('\\') {
            pending.push_str(head);
            pending.push(' ');
            continue;
        }
        pending.push_str(t);
        let (i, rest) = pending.split_once(' ').unwrap_or((&pending, ""));
        out.push((i.to_uppercase(), rest.trim().to_string()));
        pending.clear();
    }
    out
}

/// dist/Containerfile: no container can start in this sandbox (docker has no daemon; podman
/// builds the image from a local base but crun cannot start it: setrlimit refused, cgroups in
/// hybrid mode; and no base image can be pulled), so it is checked as text: the build stage
/// and the runtime stage, the binary from either, a non-root user, port 8080, the volumes, the
/// health check (`larder probe`, run for real in tests/cli.rs), larder as the entry point on
/// the shipped configuration, which `larder check` accepts.
#[test]
fn the_containerfile_copies_the_binary_and_runs_as_a_user() {
    let text = std::fs::read_to_string(Path::new(ROOT).join("dist/Containerfile")).unwrap();
    let all = instructions(&text);
    let known = [
        "FROM",
        "ARG",
        "RUN",
        "COPY",
        "USER",
        "WORKDIR",
        "VOLUME",
        "EXPOSE",
        "STOPSIGNAL",
        "ENTRYPOINT",
        "CMD",
        "ENV",
        "LABEL",
        "HEALTHCHECK",
    ];
    for (i, args) in &all {
        assert!(
            known.contains(&i.as_str()),
            "unknown instruction {i} {args}"
        );
    }
    let of = |name: &str| -> Vec<&str> {
        all.iter()
            .filter(|(i, _)| i == name)
            .map(|(_, a)| a.as_str())
            .collect()
    };
    // Only ARGs (those FROM reads) may come before FROM.
    let first = all.iter().find(|(i, _)| i != "ARG").unwrap();
    assert_eq!(first.0, "FROM", "a Containerfile starts FROM a base");
    // Multi-stage: larder built from the source tree, a runtime stage, the two ways of putting
    // the binary in it; the last stage (the default target) takes stage 1's.
    assert_eq!(
        of("FROM"),
        [
            "${BUILDER} AS build",
            "${BASE} AS runtime",
            "runtime AS prebuilt",
            "runtime AS image"
        ]
    );
    assert!(of("ARG").contains(&"BASE=docker.io/library/debian:bookworm-slim"));
    assert!(of("ARG").iter().any(|a| a.starts_with("BUILDER=")));
    assert!(of("RUN")
        .iter()
        .any(|r| r.contains("cargo build --release --locked")));
    assert!(of("ARG").iter().any(|a| a.starts_with("LARDER_BIN=")));
    assert_eq!(
        all.last().unwrap(),
        &(
            "COPY".to_string(),
            "--from=build /out/larder /usr/bin/larder".to_string()
        )
    );
    assert!(of("COPY").contains(&"${LARDER_BIN} /usr/bin/larder"));
    // The health check is `larder probe` of /ping (the image has no curl), with the runtime
    // stage's user; state and cache are volumes.
    let check = of("HEALTHCHECK");
    assert_eq!(check.len(), 1);
    let cmd = check[0]
        .split_once("CMD ")
        .expect("HEALTHCHECK ... CMD [...]")
        .1;
    let cmd: Vec<String> = serde_json::from_str(cmd).unwrap();
    assert_eq!(cmd[..2], ["/usr/bin/larder", "probe"]);
    assert!(cmd.contains(&"/ping".to_string()));
    assert_eq!(
        of("VOLUME"),
        ["[\"/var/lib/larder\", \"/var/cache/larder\"]"]
    );
    let user = of("USER");
    assert!(
        user.len() == 1 && !["root", "0"].contains(&user[0]),
        "{user:?}"
    );
    // USER comes before the entry point runs anything.
    let pos = |name: &str| all.iter().position(|(i, _)| i == name).unwrap();
    assert!(pos("USER") < pos("ENTRYPOINT"));
    assert_eq!(of("EXPOSE"), ["8080"]);
    assert!(
        text.contains("127.0.0.1:8080"),
        "the probe asks the port exposed"
    );
    assert_eq!(of("ENTRYPOINT"), ["[\"/usr/bin/larder\"]"]);
    let cmd: Vec<String> = serde_json::from_str(of("CMD")[0]).unwrap();
    assert_eq!(cmd, ["--config", "/etc/larder/larder.toml"]);
    // The configuration copied in is dist/larder.toml, and it checks.
    assert!(of("COPY").contains(&"dist/larder.toml /etc/larder/larder.toml"));
    let out = larder_command()
        .arg("check")
        .arg(Path::new(ROOT).join("dist/larder.toml"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// dist/Containerfile builds with podman (`--target prebuilt`: the binary of this test run,
/// stripped, on the Debian 12 base tests/provision made with debootstrap, since no registry is
/// reachable here; `--format docker`, which keeps the HEALTHCHECK), and the image says what the
/// file says: user `larder`, larder as the entry point on the shipped configuration, port 8080,
/// the two volumes, the health check running `larder probe`. What cannot run here: a container
/// (crun: setrlimit refused in this sandbox), nor the first stage (the Rust image is pulled
/// from a registry).
#[test]
fn the_container_image_builds_with_podman() {
    let podman = common::apt("podman", "podman");
    let podman = |args: &[&str]| {
        let out = Command::new(&podman)
            .arg("--storage-driver=vfs")
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "podman {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let ctx = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(ctx.path().join("dist")).unwrap();
    std::fs::create_dir_all(ctx.path().join("bin")).unwrap();
    for f in ["dist/Containerfile", "dist/larder.toml"] {
        std::fs::copy(Path::new(ROOT).join(f), ctx.path().join(f)).unwrap();
    }
    let binary = ctx.path().join("bin/larder");
    let stripped = Command::new("strip")
        .arg("-o")
        .arg(&binary)
        .arg(env!("CARGO_BIN_EXE_larder"))
        .status()
        .is_ok_and(|s| s.success());
    if !stripped {
        std::fs::copy(env!("CARGO_BIN_EXE_larder"), &binary).unwrap();
    }
    let tag = format!("localhost/larder-test-{}", std::process::id());
    let context = ctx.path().to_str().unwrap();
    let file = ctx.path().join("dist/Containerfile");
    podman(&[
        "build",
        "--isolation=chroot",
        "--format=docker",
        "--target=prebuilt",
        "--build-arg=BASE=localhost/bookworm",
        "--build-arg=LARDER_BIN=bin/larder",
        "-f",
        file.to_str().unwrap(),
        "-t",
        &tag,
        context,
    ]);
    let inspect = podman(&["image", "inspect", &tag]);
    podman(&["rmi", "-f", &tag]);
    let v: serde_json::Value = serde_json::from_str(&inspect).unwrap();
    let config = &v[0]["Config"];
    assert_eq!(config["User"], "larder", "{config}");
    assert_eq!(config["Entrypoint"][0], "/usr/bin/larder");
    assert_eq!(
        config["Cmd"],
        serde_json::json!(["--config", "/etc/larder/larder.toml"])
    );
    assert!(config["ExposedPorts"].get("8080/tcp").is_some(), "{config}");
    for volume in ["/var/lib/larder", "/var/cache/larder"] {
        assert!(config["Volumes"].get(volume).is_some(), "{config}");
    }
    let check = v[0]["Healthcheck"]["Test"].to_string();
    assert!(
        check.contains("probe") && check.contains("/ping"),
        "{check}"
    );
}

/// `[package.metadata.deb]`: every asset it packages exists, or is one `dist/deb` makes
/// (under target/release/); the shipped configuration (dist/larder.toml) is
/// /etc/larder/larder.toml, a conffile; the unit and the maintainer scripts are there, and the
/// scripts parse.
#[test]
fn the_debian_package_metadata_names_files_that_exist() {
    let manifest: toml::Table =
        toml::from_str(&std::fs::read_to_string(Path::new(ROOT).join("Cargo.toml")).unwrap())
            .unwrap();
    let deb = manifest["package"]["metadata"]["deb"].as_table().unwrap();
    let assets = deb["assets"].as_array().unwrap();
    let script = std::fs::read_to_string(Path::new(ROOT).join("dist/deb")).unwrap();
    let mut targets = Vec::new();
    for a in assets {
        let a = a.as_array().unwrap();
        let (src, dst) = (a[0].as_str().unwrap(), a[1].as_str().unwrap());
        targets.push(dst.to_string());
        match src.strip_prefix("target/release/") {
            // The binary from the release build, the rest from dist/deb.
            Some("larder") => {}
            Some(made) => assert!(
                script.contains(&format!("$out/{}", made.trim_start_matches("assets/"))),
                "dist/deb does not make {src}"
            ),
            None => assert!(Path::new(ROOT).join(src).exists(), "no {src}"),
        }
    }
    for want in [
        "usr/bin/",
        "etc/larder/larder.toml",
        "usr/share/man/man1/larder.1.gz",
        "usr/share/bash-completion/completions/larder",
    ] {
        assert!(
            targets.iter().any(|t| t == want),
            "the package lacks {want}"
        );
    }
    let conf: Vec<&str> = (deb["conf-files"].as_array().unwrap().iter())
        .map(|c| c.as_str().unwrap())
        .collect();
    assert_eq!(conf, ["/etc/larder/larder.toml"]);
    let units = deb["systemd-units"].as_table().unwrap();
    let dir = Path::new(ROOT).join(units["unit-scripts"].as_str().unwrap());
    assert!(dir.join("larder.service").exists());
    let scripts = Path::new(ROOT).join(deb["maintainer-scripts"].as_str().unwrap());
    for name in ["postinst", "postrm"] {
        let path = scripts.join(name);
        let text = std::fs::read_to_string(&path).unwrap();
        // cargo-deb puts the unit's steps where this token stands: once, on a line of its own
        // (the first one found is replaced, in a comment too).
        assert_eq!(text.matches("#DEBHELPER#").count(), 1, "{name}");
        assert!(text.lines().any(|l| l == "#DEBHELPER#"), "{name}");
        let ok = Command::new("sh").arg("-n").arg(&path).status().unwrap();
        assert!(ok.success(), "{name} does not parse");
    }
    assert!(
        std::fs::read_to_string(scripts.join("postinst"))
            .unwrap()
            .contains("adduser --system --group"),
        "postinst makes the larder user"
    );
}

/// A package removed (purged) when dropped, so that a failing test leaves nothing installed.
struct Installed;

impl Drop for Installed {
    fn drop(&mut self) {
        let _ = Command::new("dpkg")
            .args(["--purge", "larder"])
            .stdout(Stdio::null())
            .status();
    }
}

/// The Debian package, made by cargo-deb from `[package.metadata.deb]` out of the binary under
/// test (the debug build: `--profile dev`; dist/deb makes the release one), installed with
/// `dpkg -i`: `larder --version` and `larder check` of the shipped configuration work, the
/// man page, completions, unit and conffile are where Debian keeps them, the `larder` user
/// exists; then purged. Needs root (dpkg), as CI and tests/provision run.
#[test]
fn the_debian_package_installs_and_runs() {
    // SAFETY: geteuid touches no memory.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("not run as root: dpkg -i cannot be tested here");
        return;
    }
    if Path::new("/usr/bin/larder").exists() && !installed_by_dpkg() {
        panic!("/usr/bin/larder exists and is not the package's: not overwriting it");
    }
    let cargo_deb = common::cargo_deb_dir();
    // One install at a time on this machine (two test runs, two clones).
    let lock = std::fs::File::create("/tmp/larder-deb-test.lock").unwrap();
    // SAFETY: flock on a file this test holds open.
    assert_eq!(
        unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&lock), libc::LOCK_EX) },
        0
    );

    // The assets dist/deb makes from the binary, in the debug build's directory.
    let bin = PathBuf::from(larder_command().get_program());
    let profile_dir = bin.parent().unwrap();
    let target_dir = profile_dir.parent().unwrap();
    let assets = profile_dir.join("assets");
    std::fs::create_dir_all(&assets).unwrap();
    let mut gz = flate2::write::GzEncoder::new(
        std::fs::File::create(assets.join("larder.1.gz")).unwrap(),
        flate2::Compression::best(),
    );
    gz.write_all(stdout_of(&["manpage"]).as_bytes()).unwrap();
    gz.finish().unwrap();
    for (shell, file) in [
        ("bash", "larder.bash"),
        ("zsh", "_larder"),
        ("fish", "larder.fish"),
    ] {
        std::fs::write(assets.join(file), stdout_of(&["completions", shell])).unwrap();
    }
    let out_dir = tempfile::tempdir().unwrap();
    let deb = out_dir.path().join("larder.deb");
    let path = format!(
        "{}:{}",
        cargo_deb.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let made = Command::new(env!("CARGO"))
        .args([
            "deb",
            "--no-build",
            "--profile",
            "dev",
            "--fast",
            "--output",
        ])
        .arg(&deb)
        .current_dir(ROOT)
        .env("PATH", path)
        .env("CARGO_TARGET_DIR", target_dir)
        .output()
        .unwrap();
    assert!(
        made.status.success(),
        "cargo deb: {}",
        String::from_utf8_lossy(&made.stderr)
    );

    let _installed = Installed;
    let dpkg = Command::new("dpkg")
        .arg("-i")
        .arg(&deb)
        .env("DEBIAN_FRONTEND", "noninteractive")
        .output()
        .unwrap();
    assert!(
        dpkg.status.success(),
        "dpkg -i: {}{}",
        String::from_utf8_lossy(&dpkg.stdout),
        String::from_utf8_lossy(&dpkg.stderr)
    );
    let run = |args: &[&str]| {
        let out = Command::new("/usr/bin/larder").args(args).output().unwrap();
        let said = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "larder {args:?}: {said}");
        said
    };
    assert_eq!(run(&["--version"]), stdout_of(&["--version"]));
    assert!(run(&["check", "/etc/larder/larder.toml"]).contains(": ok ("));
    let files = String::from_utf8(
        Command::new("dpkg")
            .args(["-L", "larder"])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    for want in [
        "/usr/bin/larder",
        "/etc/larder/larder.toml",
        "/usr/share/man/man1/larder.1.gz",
        "/usr/share/bash-completion/completions/larder",
        "/usr/share/doc/larder/examples/larder.example.toml",
        "/etc/logrotate.d/larder",
    ] {
        assert!(files.lines().any(|l| l == want), "no {want} in:\n{files}");
    }
    assert!(
        files
            .lines()
            .any(|l| l.ends_with("/systemd/system/larder.service")),
        "no unit in:\n{files}"
    );
    let conffiles = Command::new("dpkg-query")
        .args(["-W", "-f", "${Conffiles}", "larder"])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&conffiles.stdout).contains("/etc/larder/larder.toml"),
        "a conffile"
    );
    assert!(
        larder::config::lookup_user("larder").is_some(),
        "postinst made the larder user"
    );
    // Enabled at install (deb-systemd-helper's link, made without a running systemd too).
    assert!(
        Path::new("/etc/systemd/system/multi-user.target.wants/larder.service").exists(),
        "the unit is enabled"
    );
    drop(_installed);
    assert!(!Path::new("/usr/bin/larder").exists(), "purged");
    assert!(!Path::new("/etc/larder/larder.toml").exists(), "purged");
}

/// Whether dpkg knows a package `larder` (one left by an earlier run of this test).
fn installed_by_dpkg() -> bool {
    Command::new("dpkg")
        .args(["-s", "larder"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}
