//! Reloading the configuration while serving: routes and pools swapped under a bounded client
//! loop with no request failing and each answered by the configuration in force; unchanged
//! pools and the cache kept; listeners added and removed; a bad configuration refused with
//! the running one kept; and, through the binary, SIGHUP, `larder reload` and a watched file.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;

/// Version `v` of the configuration: `/v` answers `v{v}`, `/` goes to the pool `app` of
/// `backend`, `/keep/` to the pool `keep` (the same in every version), `/c` is cached.
fn version(v: u32, backend: &str, keep: &str, extra_listener: bool) -> String {
    let extra = if extra_listener {
        "[[listener]]\naddr = \"127.0.0.1:0\"\n  [[listener.route]]\n  respond = { body = \"extra\" }\n"
    } else {
        ""
    };
    format!(
        r#"
[[listener]]
addr = "127.0.0.1:0"
  [[listener.route]]
  path = "/v"
  respond = {{ body = "v{v}" }}
  [[listener.route]]
  path = "/keep/"
  proxy = {{ pool = "keep", cache = false }}
  [[listener.route]]
  path = "/c"
  proxy = {{ pool = "keep" }}
  [[listener.route]]
  path = "/"
  proxy = {{ pool = "app", cache = false }}
{extra}
[pool.app]
backends = ["{backend}"]

[pool.keep]
backends = ["{keep}"]
"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_reloads_under_load_lose_no_request() {
    let a = Origin::start(|_, _| Reply::ok("a")).await;
    let b = Origin::start(|_, _| Reply::ok("b")).await;
    let keep = Origin::start(|seen, _| {
        if seen.path == "/c" {
            Reply::ok("cached").header("cache-control", "max-age=600")
        } else {
            Reply::ok("keep")
        }
    })
    .await;
    let v = |n: u32| {
        let backend = if n == 1 { a.url() } else { b.url() };
        version(n, &backend, &keep.url(), false)
    };
    let l = Arc::new(Larder::start(&v(1)).await);
    let c = client();
    assert_eq!(get(&c, &l.url("/c"), &[]).await.cache(), "MISS");

    // (sent, received, path, status, body) of every request the loop made.
    type Record = (Instant, Instant, &'static str, u16, String);
    let records: Arc<Mutex<Vec<Record>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let mut loops = Vec::new();
    for k in 0..4 {
        let (l, records, stop) = (Arc::clone(&l), Arc::clone(&records), Arc::clone(&stop));
        loops.push(tokio::spawn(async move {
            let c = client();
            let paths = ["/v", "/", "/keep/x", "/c"];
            let mut i = k;
            while !stop.load(Ordering::Relaxed) {
                let path = paths[i % paths.len()];
                i += 1;
                let sent = Instant::now();
                let g = get(&c, &l.url(path), &[]).await;
                let got = (sent, Instant::now(), path, g.status.as_u16(), g.text());
                records.lock().unwrap().push(got);
            }
        }));
    }
    // (reload started, reload returned, version now in force).
    let mut reloads = vec![(Instant::now(), Instant::now(), 1)];
    for n in 0..20 {
        tokio::time::sleep(Duration::from_millis(40)).await;
        let next = if n % 2 == 0 { 2 } else { 1 };
        let started = Instant::now();
        let restart = l.reload(&v(next)).expect("reloads");
        assert!(restart.is_empty(), "{restart:?}");
        reloads.push((started, Instant::now(), next));
    }
    tokio::time::sleep(Duration::from_millis(40)).await;
    stop.store(true, Ordering::Relaxed);
    for h in loops {
        h.await.unwrap();
    }
    let records = records.lock().unwrap();
    assert!(records.len() > 200, "only {} requests", records.len());
    let mut checked = 0;
    for (sent, received, path, status, body) in records.iter() {
        assert_eq!(*status, 200, "{path}: {body}");
        // The version in force for the whole exchange, when no reload overlapped it.
        let in_force = (reloads.iter().enumerate()).find(|(i, (_, done, _))| {
            done <= sent
                && reloads
                    .get(i + 1)
                    .is_none_or(|(next, _, _)| received < next)
        });
        let Some((_, (_, _, n))) = in_force else {
            continue;
        };
        let want = match (*path, n) {
            ("/v", n) => format!("v{n}"),
            ("/", 1) => "a".into(),
            ("/", _) => "b".into(),
            ("/keep/x", _) => "keep".into(),
            ("/c", _) => "cached".into(),
            _ => unreachable!(),
        };
        assert_eq!(body, &want, "{path} in version {n}");
        checked += 1;
    }
    assert!(
        checked > 100,
        "only {checked} requests fell between reloads"
    );
    // The cache survived every reload: one origin fetch of /c in all.
    assert_eq!(keep.seen().iter().filter(|s| s.path == "/c").count(), 1);
    // The unchanged pool was kept (its counts were never reset); the changed one was rebuilt.
    let pools = l.pools();
    let keep_pool = (pools.as_array().unwrap().iter())
        .find(|p| p["name"] == "keep")
        .unwrap();
    let keep_requests = keep_pool["backends"][0]["requests"].as_u64().unwrap();
    let sent_to_keep = keep.seen().iter().filter(|s| s.path == "/keep/x").count() as u64 + 1;
    assert_eq!(keep_requests, sent_to_keep);
}

#[tokio::test]
async fn a_bad_configuration_is_refused_and_the_running_one_stays() {
    let a = Origin::start(|_, _| Reply::ok("a")).await;
    let good = version(1, &a.url(), &a.url(), false);
    let l = Larder::start(&good).await;
    let bad = good.replace("pool = \"app\"", "pool = \"nope\"");
    let e = l.reload(&bad).unwrap_err();
    assert!(e.contains("no [pool.nope]"), "{e}");
    let e = l
        .reload(&good.replace("backends = [\"http", "backends = [\"ftp"))
        .unwrap_err();
    assert!(e.contains("scheme"), "{e}");
    let c = client();
    assert_eq!(get(&c, &l.url("/v"), &[]).await.text(), "v1");
    assert_eq!(get(&c, &l.url("/x"), &[]).await.text(), "a");
    // What a running process cannot change is named, and the rest applies.
    let restart = l
        .reload(&format!(
            "[cache]\nmax_size = \"64MB\"\n{}",
            version(2, &a.url(), &a.url(), false)
        ))
        .unwrap();
    assert_eq!(restart, ["[cache]"]);
    assert_eq!(get(&c, &l.url("/v"), &[]).await.text(), "v2");
}

#[tokio::test]
async fn listeners_are_added_and_removed() {
    let a = Origin::start(|_, _| Reply::ok("a")).await;
    let l = Larder::start(&version(1, &a.url(), &a.url(), false)).await;
    let first = l.listener_addrs()[0];
    l.reload(&version(1, &a.url(), &a.url(), true)).unwrap();
    let addrs = l.listener_addrs();
    assert_eq!(addrs.len(), 2);
    assert_eq!(addrs[0], first, "the kept listener keeps its socket");
    let c = client();
    let extra = format!("http://{}/", addrs[1]);
    assert_eq!(get(&c, &extra, &[]).await.text(), "extra");
    // A connection open on the removed listener finishes its request; new ones are refused.
    let mut open = Raw::connect(addrs[1]).await;
    l.reload(&version(1, &a.url(), &a.url(), false)).unwrap();
    assert_eq!(l.listener_addrs(), [first]);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(
        Raw::try_connect(addrs[1]).await.is_err(),
        "the removed listener still accepts"
    );
    open.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await;
    let resp = open.response().await;
    assert_eq!(resp.status, 200);
    assert_eq!(get(&c, &l.url("/v"), &[]).await.text(), "v1");
}

/// The binary: `larder reload` through the admin API, a refused file named with its line,
/// SIGHUP, and a watched file.
#[tokio::test(flavor = "multi_thread")]
async fn sighup_larder_reload_and_a_watched_file() {
    let dir = tempfile::tempdir().unwrap();
    let (addr, admin) = (free_port(), free_port());
    let file = dir.path().join("larder.toml");
    let text = |body: &str, watch: &str| {
        format!(
            "[server]\nwatch_config = \"{watch}\"\n[admin]\ntoken = \"t0k\"\nlisten = \"{admin}\"\n[[listener]]\naddr = \"{addr}\"\n  [[listener.route]]\n  respond = {{ body = \"{body}\" }}\n"
        )
    };
    std::fs::write(&file, text("one", "0s")).unwrap();
    let child = Child(
        larder_command()
            .arg("--config")
            .arg(&file)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while Raw::try_connect(addr).await.is_err() {
        assert!(Instant::now() < deadline, "larder did not start");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let c = client();
    let url = format!("http://{addr}/");
    let body = |c: Client, url: String| async move { get(&c, &url, &[]).await.text() };
    assert_eq!(body(c.clone(), url.clone()).await, "one");

    let reload = || {
        larder_command()
            .args(["reload", "--admin", &admin.to_string(), "--token", "t0k"])
            .output()
            .unwrap()
    };
    std::fs::write(&file, text("two", "0s")).unwrap();
    let out = reload();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "configuration reloaded"
    );
    assert_eq!(body(c.clone(), url.clone()).await, "two");

    std::fs::write(&file, text("two", "0s").replace("respond", "respnd")).unwrap();
    let out = reload();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("refused") && err.contains("line 9"), "{err}");
    assert_eq!(body(c.clone(), url.clone()).await, "two");

    // SIGHUP; the new file also turns on watching it.
    std::fs::write(&file, text("three", "100ms")).unwrap();
    // SAFETY: kill(2) on our own child.
    assert_eq!(unsafe { libc::kill(child.0.id() as i32, libc::SIGHUP) }, 0);
    let deadline = Instant::now() + Duration::from_secs(5);
    while body(c.clone(), url.clone()).await != "three" {
        assert!(Instant::now() < deadline, "SIGHUP did not reload");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // [server] is kept as started: watching is not on yet. A reload through the API names it.
    let out = reload();
    assert!(String::from_utf8_lossy(&out.stdout).contains("[server]"));
}

/// `[server] watch_config`: a change of the file is reloaded without a signal; a broken file
/// is logged and changes nothing.
#[tokio::test]
async fn a_watched_file_reloads_itself() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("larder.toml");
    let text = |body: &str| {
        format!("[server]\nwatch_config = \"100ms\"\n[[listener]]\naddr = \"127.0.0.1:0\"\n  [[listener.route]]\n  respond = {{ body = \"{body}\" }}\n")
    };
    std::fs::write(&file, text("one")).unwrap();
    let l = Larder::from_config(larder::config::Config::load(&file).unwrap()).await;
    let c = client();
    assert_eq!(get(&c, &l.url("/"), &[]).await.text(), "one");
    std::fs::write(&file, text("broken").replace("respond", "respnd")).unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(get(&c, &l.url("/"), &[]).await.text(), "one");
    std::fs::write(&file, text("two")).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while get(&c, &l.url("/"), &[]).await.text() != "two" {
        assert!(Instant::now() < deadline, "the change was not reloaded");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
