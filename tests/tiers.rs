//! The cache tiers below memory, with larder run as processes (so that they can be killed and
//! restarted) in front of a test origin: the disk tier across kill -9 and restarts (bodies
//! always the origin's, a corrupt record a miss), and nodes sharing one cache through a real
//! redis-server (fill on one, hit on the others, one origin fetch for concurrent misses on
//! several nodes, purges reaching every node, a node killed and restarted, Redis down), and the
//! same over a real 3-master Redis Cluster.

mod common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;

/// The Host every request names: nodes behind a load balancer see the same one.
const HOST: (&str, &str) = ("host", "www.fleet.test");
const AUTH: (&str, &str) = ("authorization", "Bearer s3cret");

/// The body the origin serves for `path`: text (so it gets compressed variants) whose length
/// and bytes depend on the path, 0.5 KB to ~30 KB.
fn body_of(path: &str) -> String {
    let h = path.bytes().fold(1469598103934665603u64, |h, b| {
        (h ^ b as u64).wrapping_mul(1099511628211)
    });
    let lines = 10 + (h % 500) as usize;
    let mut s = String::with_capacity(lines * 100);
    for i in 0..lines {
        s.push_str(&format!(
            "{path} line {i} of {lines} {:016x}\n",
            h.rotate_left(i as u32 % 64)
        ));
    }
    s
}

/// An origin serving [`body_of`] every path, fresh for `max_age` seconds, with a tag (the
/// path's first segment) and validators; `delay` before each answer.
async fn origin(max_age: u32, delay: Duration) -> Origin {
    Origin::start(move |seen, _| {
        let path = seen.path.clone();
        let tag = path
            .trim_start_matches('/')
            .split('/')
            .next()
            .unwrap_or("")
            .to_string();
        Reply::ok(body_of(&path))
            .header("content-type", "text/plain")
            .header("cache-control", &format!("max-age={max_age}"))
            .header("etag", &format!("\"{}\"", body_of(&path).len()))
            .header("surrogate-key", &format!("{tag} all"))
            .delay(delay)
    })
    .await
}

/// A larder process with its own config file, listener and admin API.
struct Node {
    child: Option<Child>,
    addr: SocketAddr,
    admin: SocketAddr,
    cfg: PathBuf,
}

impl Node {
    /// A node proxying to `origin` with `cache_toml` (its `[cache.*]` tables) in its config.
    fn start(dir: &Path, name: &str, origin: SocketAddr, cache_toml: &str) -> Node {
        let route = format!("proxy = {{ upstream = \"http://{origin}\" }}");
        Node::with_route(dir, name, &route, cache_toml)
    }

    /// A node whose one route is `route` (its handler key).
    fn with_route(dir: &Path, name: &str, route: &str, cache_toml: &str) -> Node {
        let (addr, admin) = (free_port(), free_port());
        let cfg = dir.join(format!("{name}.toml"));
        std::fs::write(
            &cfg,
            format!(
                "[admin]\nlisten = \"{admin}\"\ntoken = \"s3cret\"\n\n{cache_toml}\n\n\
                 [[listener]]\naddr = \"{addr}\"\n  [[listener.route]]\n  path = \"/\"\n  \
                 {route}\n"
            ),
        )
        .unwrap();
        let mut node = Node {
            child: None,
            addr,
            admin,
            cfg,
        };
        node.restart();
        node
    }

    fn restart(&mut self) {
        let log = std::fs::File::create(self.cfg.with_extension("log")).unwrap();
        let child = larder_command()
            .arg("--config")
            .arg(&self.cfg)
            .stdout(std::process::Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        self.child = Some(Child(child));
        for _ in 0..200 {
            if std::net::TcpStream::connect(self.addr).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        panic!(
            "larder did not start: {}",
            std::fs::read_to_string(self.cfg.with_extension("log")).unwrap_or_default()
        );
    }

    /// kill -9.
    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            c.0.kill().unwrap();
            c.0.wait().unwrap();
        }
    }

    /// SIGTERM, and wait for the graceful exit.
    fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            unsafe { libc::kill(c.0.id() as i32, libc::SIGTERM) };
            c.0.wait().unwrap();
        }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    async fn get(&self, c: &Client, path: &str) -> Got {
        get(c, &self.url(path), &[HOST]).await
    }

    /// The admin API's status document.
    async fn status(&self, c: &Client) -> serde_json::Value {
        let g = get(c, &format!("http://{}/_larder/status", self.admin), &[AUTH]).await;
        serde_json::from_slice(&g.body).unwrap()
    }

    /// One tier's counts from the status document.
    async fn tier(&self, c: &Client, tier: &str) -> serde_json::Value {
        let s = self.status(c).await;
        s["cache"]["tiers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["tier"] == tier)
            .cloned()
            .unwrap_or_else(|| panic!("no {tier} tier in {s}"))
    }

    /// Whether the disk tier took `n` writes within 10 s.
    async fn disk_writes(&self, c: &Client, n: u64) -> bool {
        eventually(Duration::from_secs(10), async || {
            self.tier(c, "disk").await["writes"].as_u64().unwrap() >= n
        })
        .await
    }

    /// Whether `path` left this node's memory within a second (only-if-cached answers 504).
    async fn drops(&self, c: &Client, path: &str) -> bool {
        let url = self.url(path);
        eventually(Duration::from_secs(1), async || {
            let g = get(c, &url, &[HOST, ("cache-control", "only-if-cached")]).await;
            g.status == 504
        })
        .await
    }

    async fn purge(&self, c: &Client, query: &str) {
        let g = send(
            c,
            "POST",
            &format!("http://{}/_larder/purge?{query}", self.admin),
            &[AUTH],
            b"",
        )
        .await;
        assert_eq!(g.status, 200, "purge {query}: {}", g.text());
    }
}

fn assert_body(g: &Got, path: &str) {
    assert_eq!(g.status, 200, "{path}");
    let body = decode(&g.body, g.header("content-encoding"));
    assert!(
        body == body_of(path).as_bytes(),
        "{path}: a body of {} bytes that is not the origin's ({} bytes)",
        body.len(),
        body_of(path).len()
    );
}

/// Waits until `check` holds (at most `within`), polling.
async fn eventually(within: Duration, mut check: impl AsyncFnMut() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if check().await {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn disk_toml(dir: &Path) -> String {
    format!(
        "[cache.disk]\ndir = \"{}\"\nmax_size = \"256MiB\"\n",
        dir.display()
    )
}

/// An origin, and a node in front of it with a disk tier in `dir/disk`.
async fn disk_node(dir: &Path) -> (Origin, Node) {
    let origin = origin(600, Duration::ZERO).await;
    let node = Node::start(dir, "a", origin.addr, &disk_toml(&dir.join("disk")));
    (origin, node)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_disk_tier_keeps_the_cache_across_kill_9_and_every_body_is_the_origins() {
    let dir = tempfile::tempdir().unwrap();
    let (origin, mut node) = disk_node(dir.path()).await;
    let c = client();

    // Filled, compressed variants built, and written down (give the writer time).
    let settled: Vec<String> = (0..30).map(|i| format!("/settled/{i}")).collect();
    for p in &settled {
        assert_body(&node.get(&c, p).await, p);
    }
    for p in &settled {
        wait_for_encoding_with(&c, &node.url(p), "gzip").await;
    }
    assert!(
        node.disk_writes(&c, settled.len() as u64).await,
        "every settled response is written to disk"
    );
    tokio::time::sleep(Duration::from_millis(1500)).await;

    // kill -9 in the middle of filling more: once the load has had `BEFORE_KILL` responses
    // (counted as they complete, whatever the machine's speed; bench/tiers_bench.py measures
    // how many a second), while it goes on.
    const BEFORE_KILL: usize = 24;
    let answered = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut load = Vec::new();
    for w in 0..8 {
        let (c, url, answered) = (c.clone(), node.url(""), answered.clone());
        load.push(tokio::spawn(async move {
            let mut reached = 0;
            for i in 0.. {
                let req = http::Request::get(format!("{url}/load/{w}-{i}"))
                    .header(HOST.0, HOST.1)
                    .header("accept-encoding", "br")
                    .body(http_body_util::Full::new(bytes::Bytes::new()))
                    .unwrap();
                let answer = async {
                    let r = c.request(req).await.ok()?;
                    let ok = r.status() == 200;
                    http_body_util::BodyExt::collect(r.into_body()).await.ok()?;
                    Some(ok)
                };
                match tokio::time::timeout(Duration::from_secs(2), answer).await {
                    Ok(Some(true)) => {
                        reached = i + 1;
                        answered.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    }
                    _ => break,
                };
            }
            reached
        }));
    }
    let waiting = std::time::Instant::now();
    while answered.load(std::sync::atomic::Ordering::SeqCst) < BEFORE_KILL {
        // A guard against a hang, not a speed: a stalled load fails here.
        assert!(
            waiting.elapsed() < Duration::from_secs(60),
            "the load stalled at {answered:?} responses"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    node.kill();
    let mut reached = Vec::new();
    for l in load {
        reached.push(l.await.unwrap());
    }
    let loaded: usize = reached.iter().sum();
    assert!(
        loaded >= BEFORE_KILL,
        "the load ran ({loaded} responses) before the kill"
    );

    // Restarted: the settled responses are disk hits, aged across the downtime; whatever was
    // being written when the process died is either read whole or not at all.
    std::thread::sleep(Duration::from_millis(1100));
    node.restart();
    let before = origin.hits();
    for p in &settled {
        let g = node.get(&c, p).await;
        assert_body(&g, p);
        assert_eq!(g.cache(), "HIT", "{p} after the restart");
        let age: u64 = g.header("age").unwrap().parse().unwrap();
        assert!(age >= 2, "{p}: Age {age} counts the downtime");
        let gz = get(&c, &node.url(p), &[HOST, ("accept-encoding", "gzip")]).await;
        assert_eq!(
            gz.header("content-encoding"),
            Some("gzip"),
            "{p}: variants kept"
        );
        assert_body(&gz, p);
    }
    assert_eq!(
        origin.hits(),
        before,
        "no origin fetch for what the disk kept"
    );
    // The first responses of each writer, and those around the kill.
    for (w, &n) in reached.iter().enumerate() {
        for i in (0..n.min(3)).chain(n.saturating_sub(4)..n + 1) {
            let p = format!("/load/{w}-{i}");
            for enc in ["identity", "br"] {
                let g = get(&c, &node.url(&p), &[HOST, ("accept-encoding", enc)]).await;
                assert_body(&g, &p);
            }
        }
    }
    let disk = node.tier(&c, "disk").await;
    assert!(
        disk["hits"].as_u64().unwrap() >= settled.len() as u64,
        "{disk}"
    );
}

/// [`wait_for_encoding`] with the fleet's Host.
async fn wait_for_encoding_with(c: &Client, url: &str, enc: &str) {
    for _ in 0..300 {
        let g = get(c, url, &[HOST, ("accept-encoding", enc)]).await;
        if g.header("content-encoding") == Some(enc) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("no {enc} variant of {url} appeared");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_disk_record_is_a_miss_never_served() {
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("disk");
    let origin = origin(600, Duration::ZERO).await;
    let mut node = Node::start(dir.path(), "a", origin.addr, &disk_toml(&disk));
    let c = client();
    let (bad, good) = ("/corrupt/me", "/intact/me");
    for p in [bad, good] {
        assert_body(&node.get(&c, p).await, p);
        wait_for_encoding_with(&c, &node.url(p), "gzip").await;
    }
    assert!(node.disk_writes(&c, 2).await);
    node.stop();

    // Flip one byte inside the stored identity body of one record.
    let needle = body_of(bad);
    let needle = &needle.as_bytes()[200..264];
    let mut flipped = 0;
    for f in std::fs::read_dir(&disk).unwrap() {
        let path = f.unwrap().path();
        let mut bytes = std::fs::read(&path).unwrap();
        if let Some(at) = bytes.windows(needle.len()).position(|w| w == needle) {
            bytes[at + 10] ^= 0x20;
            std::fs::write(&path, bytes).unwrap();
            flipped += 1;
        }
    }
    assert_eq!(flipped, 1, "the record was found on disk");

    node.restart();
    let before = origin.hits();
    let g = node.get(&c, good).await;
    assert_body(&g, good);
    assert_eq!(g.cache(), "HIT");
    assert_eq!(origin.hits(), before, "the intact record is a disk hit");
    let g = node.get(&c, bad).await;
    assert_body(&g, bad);
    assert_eq!(g.cache(), "MISS", "the corrupt record is a miss");
    assert_eq!(origin.hits(), before + 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disk_hit_goes_into_memory_on_its_second_read() {
    let dir = tempfile::tempdir().unwrap();
    let (origin, mut node) = disk_node(dir.path()).await;
    let c = client();
    let p = "/twice/read";
    assert_body(&node.get(&c, p).await, p);
    wait_for_encoding_with(&c, &node.url(p), "gzip").await;
    assert!(node.disk_writes(&c, 1).await);
    node.stop();
    node.restart();

    // Memory is empty: the first two requests read the disk, the second puts it in memory.
    let hits = |t: serde_json::Value| t["hits"].as_u64().unwrap();
    for (n, disk_hits) in [(1, 1), (2, 2), (3, 2), (4, 2)] {
        let g = node.get(&c, p).await;
        assert_body(&g, p);
        assert_eq!(g.cache(), "HIT", "request {n}");
        assert_eq!(hits(node.tier(&c, "disk").await), disk_hits, "request {n}");
    }
    assert_eq!(origin.hits(), 1, "never fetched again");
}

/// A shared tier on `url`; the timeout generous enough for a loaded test machine (the test of
/// a hanging Redis sets its own).
fn shared_toml(url: &str) -> String {
    format!("[cache.shared]\nurl = \"{url}\"\ntimeout = \"3s\"\nlease = \"10s\"\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_share_one_cache_through_redis() {
    let dir = tempfile::tempdir().unwrap();
    let redis = RedisServer::start();
    let origin = origin(600, Duration::ZERO).await;
    let shared = shared_toml(&redis.url());
    let a = Node::start(dir.path(), "a", origin.addr, &shared);
    let mut b = Node::start(dir.path(), "b", origin.addr, &shared);
    let cn = Node::start(dir.path(), "c", origin.addr, &shared);
    let c = client();

    // Fill on A; B and C hit without asking the origin.
    let g = a.get(&c, "/products/1").await;
    assert_body(&g, "/products/1");
    assert_eq!(g.cache(), "MISS");
    wait_for_encoding_with(&c, &a.url("/products/1"), "br").await;
    for n in [&b, &cn] {
        let g = n.get(&c, "/products/1").await;
        assert_body(&g, "/products/1");
        assert_eq!(g.cache(), "HIT");
        let br = get(
            &c,
            &n.url("/products/1"),
            &[HOST, ("accept-encoding", "br")],
        )
        .await;
        assert_eq!(
            br.header("content-encoding"),
            Some("br"),
            "every encoding is shared"
        );
        assert_body(&br, "/products/1");
    }
    assert_eq!(origin.hits(), 1);
    assert!(b.tier(&c, "shared").await["hits"].as_u64().unwrap() >= 1);

    // Purge on C: A and B no longer hold it (only-if-cached answers 504) within a second,
    // and the shared tier neither (A's next request goes to the origin).
    let purge = send(&c, "PURGE", &cn.url("/products/1"), &[HOST, AUTH], b"").await;
    assert_eq!(purge.status, 200);
    for n in [&a, &b] {
        assert!(
            n.drops(&c, "/products/1").await,
            "the purge reached every node in 1 s"
        );
    }
    let g = a.get(&c, "/products/1").await;
    assert_eq!(g.cache(), "MISS");
    assert_eq!(origin.hits(), 2, "purged from the shared tier too");
    assert_eq!(b.get(&c, "/products/1").await.cache(), "HIT");

    // By tag and by prefix, from the admin API of another node.
    for p in ["/products/2", "/docs/a", "/docs/b"] {
        a.get(&c, p).await;
        assert_eq!(b.get(&c, p).await.cache(), "HIT");
    }
    let hits = origin.hits();
    b.purge(&c, "tag=products").await;
    b.purge(&c, &format!("prefix={}", "http://www.fleet.test/docs/"))
        .await;
    for n in [&a, &cn] {
        for p in ["/products/2", "/docs/a", "/docs/b"] {
            assert!(
                n.drops(&c, p).await,
                "{p} purged by tag or prefix on every node"
            );
        }
    }
    assert_eq!(cn.get(&c, "/docs/a").await.cache(), "MISS");
    assert_eq!(origin.hits(), hits + 1);

    // kill -9 B under load: A and C serve on.
    for i in 0..20 {
        a.get(&c, &format!("/warm/{i}")).await;
    }
    let load: Vec<_> = [a.url(""), cn.url("")]
        .into_iter()
        .map(|base| {
            let c = c.clone();
            tokio::spawn(async move {
                for i in 0..400 {
                    let p = format!("/warm/{}", i % 20);
                    let g = get(&c, &format!("{base}{p}"), &[HOST]).await;
                    assert_body(&g, &p);
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(50)).await;
    b.kill();
    for l in load {
        l.await.unwrap();
    }
    // Restarted, B serves from the shared tier at once.
    let hits = origin.hits();
    b.restart();
    for i in 0..20 {
        let p = format!("/warm/{i}");
        let g = b.get(&c, &p).await;
        assert_body(&g, &p);
        assert_eq!(g.cache(), "HIT", "{p} from the shared tier");
    }
    assert_eq!(origin.hits(), hits);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn misses_for_one_url_on_several_nodes_make_one_origin_fetch() {
    let dir = tempfile::tempdir().unwrap();
    let redis = RedisServer::start();
    let origin = origin(600, Duration::from_millis(400)).await;
    let shared = shared_toml(&redis.url());
    let nodes: Vec<Node> = ["a", "b", "c"]
        .iter()
        .map(|n| Node::start(dir.path(), n, origin.addr, &shared))
        .collect();
    let c = client();
    for round in 0..3 {
        let p = format!("/together/{round}");
        let requests: Vec<_> = (0..12)
            .map(|i| {
                let (c, url) = (c.clone(), nodes[i % 3].url(&p));
                tokio::spawn(async move { get(&c, &url, &[HOST]).await })
            })
            .collect();
        for r in requests {
            assert_body(&r.await.unwrap(), &p);
        }
    }
    assert_eq!(
        origin.hits(),
        3,
        "one origin fetch per URL for the whole fleet"
    );
    let mut waited = 0;
    for n in &nodes {
        waited += n.tier(&c, "shared").await["lease_waits"].as_u64().unwrap();
    }
    assert!(
        waited >= 3,
        "the other nodes waited on the lease ({waited})"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_redis_larder_serves_from_memory_and_origin() {
    let dir = tempfile::tempdir().unwrap();
    let mut redis = RedisServer::start();
    let origin = origin(600, Duration::ZERO).await;
    let quick = shared_toml(&redis.url()).replace("\"3s\"", "\"200ms\"");
    let node = Node::start(dir.path(), "a", origin.addr, &quick);
    let c = client();
    assert_eq!(node.get(&c, "/x").await.cache(), "MISS");

    // Redis hangs (CLIENT PAUSE): every command gives up after the timeout, requests are served.
    let errors = node.tier(&c, "shared").await["errors"].as_u64().unwrap();
    assert_eq!(redis.cli(&["client", "pause", "3000", "ALL"]).trim(), "OK");
    for p in ["/slow/1", "/slow/2"] {
        let g = node.get(&c, p).await;
        assert_body(&g, p);
        assert_eq!(g.cache(), "MISS");
    }
    let shared = node.tier(&c, "shared").await;
    assert!(
        shared["errors"].as_u64().unwrap() > errors,
        "timeouts are counted: {shared}"
    );
    redis.cli(&["client", "unpause"]);

    // Redis goes away: what memory holds is served, new URLs come from the origin.
    redis.kill();
    for _ in 0..3 {
        let g = node.get(&c, "/x").await;
        assert_body(&g, "/x");
        assert_eq!(g.cache(), "HIT");
    }
    for p in ["/y", "/z"] {
        let g = node.get(&c, p).await;
        assert_body(&g, p);
        assert_eq!(g.cache(), "MISS");
        assert_eq!(node.get(&c, p).await.cache(), "HIT");
    }
    let shared = node.tier(&c, "shared").await;
    assert!(shared["errors"].as_u64().unwrap() >= 1, "{shared}");
    let metrics = get(&c, &format!("http://{}/metrics", node.admin), &[AUTH])
        .await
        .text();
    assert!(
        metrics.contains("larder_cache_tier_errors_total{tier=\"shared\"}"),
        "{metrics}"
    );

    // Back: the tier is used again (a new fill is written, another node would find it).
    redis.restart();
    let back = eventually(Duration::from_secs(5), async || {
        node.get(&c, &format!("/after/{}", origin.hits())).await;
        !redis.cli(&["keys", "larder:e:*after*"]).trim().is_empty()
    })
    .await;
    assert!(back, "writes resume once Redis is back");

    // A node started while Redis is down starts and serves.
    redis.kill();
    let other = Node::start(dir.path(), "b", origin.addr, &quick);
    assert_body(&other.get(&c, "/w").await, "/w");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_cluster_is_shared_like_one_server() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = redis_cluster(3);
    let origin = origin(600, Duration::ZERO).await;
    // Two of the three masters named (the client learns the third from them).
    let url = format!(
        "redis+cluster://127.0.0.1:{},127.0.0.1:{}",
        cluster[0].port, cluster[1].port
    );
    let a = Node::start(dir.path(), "a", origin.addr, &shared_toml(&url));
    let b = Node::start(dir.path(), "b", origin.addr, &shared_toml(&url));
    let c = client();
    let paths: Vec<String> = (0..30).map(|i| format!("/spread/{i}")).collect();
    for p in &paths {
        assert_eq!(a.get(&c, p).await.cache(), "MISS");
    }
    for p in &paths {
        let g = b.get(&c, p).await;
        assert_body(&g, p);
        assert_eq!(g.cache(), "HIT", "{p} from the cluster");
    }
    assert_eq!(origin.hits(), paths.len());
    // The records went to every master.
    for r in &cluster {
        let n: u64 = r.cli(&["dbsize"]).trim().parse().unwrap();
        assert!(n > 0, "master {} holds some records", r.port);
    }
    // A prefix purge on B reaches A's memory and every master.
    b.purge(&c, "prefix=http://www.fleet.test/spread/").await;
    assert!(
        a.drops(&c, "/spread/7").await,
        "the purge reached the other node"
    );
    assert_eq!(a.get(&c, "/spread/7").await.cache(), "MISS");
    assert_eq!(origin.hits(), paths.len() + 1);
}

/// 6,000 bytes that depend on `path`.
fn six_k(path: &str) -> String {
    body_of(path).repeat(20)[..6000].to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_write_evicted_what_memory_lets_go_of_is_read_from_disk() {
    let dir = tempfile::tempdir().unwrap();
    let origin = Origin::start(|seen, _| {
        Reply::ok(six_k(&seen.path))
            .header("content-type", "application/octet-stream")
            .header("cache-control", "max-age=600")
    })
    .await;
    let toml = format!(
        "[cache]\nmax_size = \"64KiB\"\nmax_object_size = \"16KiB\"\n\
         [cache.disk]\ndir = \"{}\"\nmax_size = \"64MiB\"\nwrite = \"evicted\"\n{PROXY}",
        dir.path().join("disk").display()
    );
    let l = larder(&toml, &origin.url()).await;
    let c = client();
    let paths: Vec<String> = (0..40).map(|i| format!("/evicted/{i}")).collect();
    for p in &paths {
        assert_eq!(get(&c, &l.url(p), &[HOST]).await.cache(), "MISS");
    }
    assert!(l.cache_entries() < paths.len() / 2, "memory let most go");
    let before = origin.hits();
    let mut from_disk = 0;
    for p in &paths {
        let g = get(&c, &l.url(p), &[HOST]).await;
        assert_eq!(g.body, six_k(p), "{p}");
        from_disk += usize::from(g.cache() == "HIT");
    }
    let refetched = origin.hits() - before;
    assert!(
        refetched < paths.len() / 4,
        "evicted responses came back from disk ({refetched} of {} refetched)",
        paths.len()
    );
    assert_eq!(from_disk + refetched, paths.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn any_node_transforms_any_uploaded_image() {
    let dir = tempfile::tempdir().unwrap();
    let redis = RedisServer::start();
    let shared = shared_toml(&redis.url());
    let node = |name: &str| {
        let images = dir.path().join(format!("images-{name}"));
        let route = format!(
            "images = {{ dir = \"{}\", share_originals = true, originals_memory = 0 }}",
            images.display()
        );
        Node::with_route(dir.path(), name, &route, &shared)
    };
    let (a, b, cn) = (node("a"), node("b"), node("c"));
    let c = client();
    let up = send(
        &c,
        "POST",
        &a.url("/upload"),
        &[HOST, ("content-type", "image/jpeg")],
        photo(),
    )
    .await;
    assert_eq!(up.status, 200, "{}", up.text());
    let md5 = up.field("md5");

    // B has no copy of its own: it reads the original from the shared tier and transforms.
    let q = format!("/{md5}?w=40&h=30&f=png");
    let made = b.get(&c, &q).await;
    assert_eq!(made.status, 200, "{}", made.text());
    assert_eq!(made.cache(), "MISS");
    assert!(dir
        .path()
        .join(format!("images-b/{}/{}/{md5}", &md5[..2], &md5[2..4]))
        .is_file());
    // C gets B's result from the shared tier, transforming nothing.
    let shared_result = cn.get(&c, &q).await;
    assert_eq!(shared_result.status, 200);
    assert_eq!(shared_result.body, made.body);
    assert_eq!(shared_result.cache(), "HIT");
    assert!(
        !dir.path().join(format!("images-c/{}", &md5[..2])).exists(),
        "C needed no original"
    );
    assert!(cn.tier(&c, "shared").await["hits"].as_u64().unwrap() >= 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_whose_node_died_never_leaves_the_others_waiting() {
    let dir = tempfile::tempdir().unwrap();
    let redis = RedisServer::start();
    // The first fetch never finishes in time (its node is killed); later ones answer at once.
    let origin = Origin::start(|seen, n| {
        Reply::ok(body_of(&seen.path))
            .header("cache-control", "max-age=600")
            .delay(if n == 0 {
                Duration::from_secs(30)
            } else {
                Duration::ZERO
            })
    })
    .await;
    let shared = shared_toml(&redis.url()).replace("lease = \"10s\"", "lease = \"1s\"");
    let mut a = Node::start(dir.path(), "a", origin.addr, &shared);
    let b = Node::start(dir.path(), "b", origin.addr, &shared);
    let c = client();
    let stuck = {
        let (c, url) = (c.clone(), a.url("/orphan"));
        tokio::spawn(async move {
            let req = http::Request::get(url)
                .header(HOST.0, HOST.1)
                .body(http_body_util::Full::new(bytes::Bytes::new()))
                .unwrap();
            let _ = c.request(req).await;
        })
    };
    // A holds the lease, fetching; then it dies.
    let leased = eventually(Duration::from_secs(5), async || {
        !redis.cli(&["keys", "larder:l:*"]).trim().is_empty()
    })
    .await;
    assert!(leased, "A took the lease");
    // ...and its fetch reached the origin (the lease is taken first: killed before that, A
    // would leave the slow first answer to B, which would time out).
    let fetching = eventually(Duration::from_secs(5), async || origin.hits() >= 1).await;
    assert!(fetching, "A's fetch reached the origin");
    a.kill();
    let _ = stuck.await;
    // B waits for the lease to expire (1 s), then fetches for itself.
    let g = b.get(&c, "/orphan").await;
    assert_body(&g, "/orphan");
    assert_eq!(g.cache(), "MISS");
    assert_eq!(origin.hits(), 2);
}

/// Reads an event stream until `needle` appears in it (at most `within`).
async fn stream_until(body: &mut hyper::body::Incoming, needle: &str, within: Duration) -> bool {
    use http_body_util::BodyExt;
    let mut seen = String::new();
    let deadline = tokio::time::Instant::now() + within;
    while !seen.contains(needle) {
        match tokio::time::timeout_at(deadline, body.frame()).await {
            Ok(Some(Ok(f))) => {
                if let Some(d) = f.data_ref() {
                    seen.push_str(&String::from_utf8_lossy(d));
                }
            }
            _ => return false,
        }
    }
    true
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn push_records_written_on_one_node_reach_the_subscribers_of_every_node() {
    let dir = tempfile::tempdir().unwrap();
    let mut redis = RedisServer::start();
    let shared = shared_toml(&redis.url());
    let node = |name: &str| {
        let route = format!(
            "push = {{ dir = \"{}\", token = \"s3cret\", share = true }}",
            dir.path().join(format!("records-{name}")).display()
        );
        Node::with_route(dir.path(), name, &route, &shared)
    };
    let (a, b) = (node("a"), node("b"));
    let c = client();
    let put = |n: &Node, id: &str, v: &str| {
        let (c, url) = (c.clone(), n.url(&format!("/{id}")));
        let v = v.to_string();
        async move {
            let g = send(
                &c,
                "PUT",
                &url,
                &[AUTH, ("content-type", "application/json")],
                v,
            )
            .await;
            assert!(g.status.is_success(), "{}", g.text());
        }
    };
    let value_on = |n: &Node, id: &str| {
        let (c, url) = (c.clone(), n.url(&format!("/{id}")));
        async move {
            let g = get(&c, &url, &[]).await;
            (g.status == 200).then(|| g.text())
        }
    };

    let status = a.status(&c).await;
    assert_eq!(status["push"][0]["shared"], true, "{status}");

    // A subscriber on B sees what is written on A.
    let sub = request(&c, "GET", &b.url("/news?subscribe&init=0"), &[], b"").await;
    assert_eq!(sub.status(), 200);
    let mut events = sub.into_body();
    put(&a, "news", r#"{"headline":"from A"}"#).await;
    assert!(
        stream_until(&mut events, "from A", Duration::from_secs(5)).await,
        "B's subscriber got A's change"
    );
    assert_eq!(
        value_on(&b, "news").await.as_deref(),
        Some(r#"{"headline":"from A"}"#)
    );

    // A delete on B reaches A.
    let del = send(&c, "DELETE", &b.url("/news"), &[AUTH], b"").await;
    assert_eq!(del.status, 204);
    let gone = eventually(Duration::from_secs(5), async || {
        value_on(&a, "news").await.is_none()
    })
    .await;
    assert!(gone, "the delete reached A");

    // Writes of one record on both nodes at once: both end with the same value.
    for i in 0..50 {
        let (x, y) = (
            format!("{{\"n\":{i},\"by\":\"a\"}}"),
            format!("{{\"n\":{i},\"by\":\"b\"}}"),
        );
        tokio::join!(put(&a, "race", &x), put(&b, "race", &y));
    }
    let same = eventually(Duration::from_secs(5), async || {
        let (x, y) = (value_on(&a, "race").await, value_on(&b, "race").await);
        x.is_some() && x == y
    })
    .await;
    assert!(
        same,
        "the nodes converge: {:?} / {:?}",
        value_on(&a, "race").await,
        value_on(&b, "race").await
    );

    // Written while Redis is away: acknowledged, and shared once it is back.
    redis.kill();
    put(&a, "offline", r#"{"while":"down"}"#).await;
    assert_eq!(
        value_on(&a, "offline").await.as_deref(),
        Some(r#"{"while":"down"}"#)
    );
    redis.restart();
    let shared_later = eventually(Duration::from_secs(10), async || {
        value_on(&b, "offline").await.is_some()
    })
    .await;
    assert!(
        shared_later,
        "the change made while Redis was down reached B once it was back"
    );

    // A node that joins later starts with every record written since Redis is back.
    for i in 0..10 {
        put(&a, &format!("item/{i}"), &format!("{{\"i\":{i}}}")).await;
    }
    let cn = node("c");
    let all = eventually(Duration::from_secs(5), async || {
        // (This Redis keeps nothing across its restart: what was written since is shared.)
        value_on(&cn, "item/9").await.is_some() && value_on(&cn, "offline").await.is_some()
    })
    .await;
    assert!(all, "the new node has the fleet's records");
    assert_eq!(value_on(&cn, "item/3").await.as_deref(), Some(r#"{"i":3}"#));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_was_down_applies_the_purges_it_missed_to_its_disk() {
    let dir = tempfile::tempdir().unwrap();
    let redis = RedisServer::start();
    let origin = origin(600, Duration::ZERO).await;
    let with_disk = |name: &str| {
        format!(
            "{}{}",
            disk_toml(&dir.path().join(format!("disk-{name}"))),
            shared_toml(&redis.url())
        )
    };
    let mut a = Node::start(dir.path(), "a", origin.addr, &with_disk("a"));
    let b = Node::start(dir.path(), "b", origin.addr, &with_disk("b"));
    let c = client();
    for p in ["/kept", "/purged/1", "/purged/2", "/tagged"] {
        a.get(&c, p).await;
        wait_for_encoding_with(&c, &a.url(p), "gzip").await;
    }
    assert!(a.disk_writes(&c, 4).await);
    a.stop();

    // While A is down: purges by URL, prefix and tag on B (the shared tier is emptied too).
    let purge = send(&c, "PURGE", &b.url("/purged/1"), &[HOST, AUTH], b"").await;
    assert_eq!(purge.status, 200);
    b.purge(&c, "prefix=http://www.fleet.test/purged/").await;
    b.purge(&c, "tag=tagged").await;

    // A comes back: its disk still holds all four, but the purges it missed apply to them.
    a.restart();
    let hits = origin.hits();
    let kept = a.get(&c, "/kept").await;
    assert_eq!(kept.cache(), "HIT");
    assert_eq!(origin.hits(), hits, "/kept is a disk hit");
    for p in ["/purged/1", "/purged/2", "/tagged"] {
        let g = a.get(&c, p).await;
        assert_body(&g, p);
        assert_eq!(g.cache(), "MISS", "{p} was purged while A was down");
    }
    assert_eq!(origin.hits(), hits + 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_started_before_redis_connects_when_it_comes_and_pays_nothing_meanwhile() {
    let dir = tempfile::tempdir().unwrap();
    // A port for Redis, free until it is started there again.
    let mut redis = RedisServer::start();
    redis.kill();
    let origin = origin(600, Duration::ZERO).await;
    let node = Node::start(dir.path(), "a", origin.addr, &shared_toml(&redis.url()));
    let c = client();

    // Not connected: misses are served, and the tier is not even tried (no command waits out
    // its timeout, none is counted as failed).
    for p in ["/early/1", "/early/2", "/early/3"] {
        let g = node.get(&c, p).await;
        assert_body(&g, p);
        assert_eq!(g.cache(), "MISS");
    }
    let shared = node.tier(&c, "shared").await;
    assert_eq!(shared["connected"], false, "{shared}");
    assert_eq!(shared["errors"], 0, "no command was tried: {shared}");
    assert_eq!(shared["writes"], 0, "{shared}");

    // Redis comes: the node connects by itself, and its next fill is written there.
    redis.restart();
    let connected = eventually(Duration::from_secs(15), async || {
        node.tier(&c, "shared").await["connected"] == true
    })
    .await;
    assert!(connected, "the node connected once Redis came");
    let g = node.get(&c, "/late").await;
    assert_body(&g, "/late");
    let written = eventually(Duration::from_secs(5), async || {
        !redis.cli(&["keys", "larder:e:*late"]).trim().is_empty()
    })
    .await;
    assert!(
        written,
        "the fill after the connection was written to Redis"
    );
    let metrics = get(&c, &format!("http://{}/metrics", node.admin), &[AUTH])
        .await
        .text();
    assert!(
        metrics.contains("larder_cache_shared_connected{tier=\"shared\"} 1"),
        "{metrics}"
    );
}

/// A client of the test's own to `url` (binary-safe reads and writes of stored values).
async fn redis_client(url: &str) -> fred::clients::Client {
    use fred::prelude::*;
    let client = Builder::from_config(Config::from_url(url).unwrap())
        .build()
        .unwrap();
    client.init().await.unwrap();
    client
}

/// The value stored under `key`.
async fn redis_get(r: &fred::clients::Client, key: &str) -> Vec<u8> {
    use fred::prelude::*;
    let v: Option<bytes::Bytes> = r.get(key).await.unwrap();
    v.unwrap_or_else(|| panic!("nothing stored under {key}"))
        .to_vec()
}

/// Stores `value` under `key`, keeping the key's TTL (an alteration, not a new record).
async fn redis_set_keep_ttl(r: &fred::clients::Client, key: &str, value: Vec<u8>) {
    use fred::prelude::*;
    let _: () = r
        .set(key, value, Some(Expiration::KEEPTTL), None, false)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn body_bytes_altered_in_redis_are_a_miss_and_a_fresh_fetch() {
    use fred::prelude::*;
    let dir = tempfile::tempdir().unwrap();
    let redis = RedisServer::start();
    let origin = origin(600, Duration::ZERO).await;
    let shared = shared_toml(&redis.url());
    let a = Node::start(dir.path(), "a", origin.addr, &shared);
    let b = Node::start(dir.path(), "b", origin.addr, &shared);
    let c = client();
    let r = redis_client(&redis.url()).await;

    // A fills the URL, and its complete record (every encoding) lands in Redis.
    let p = "/altered";
    assert_body(&a.get(&c, p).await, p);
    wait_for_encoding_with(&c, &a.url(p), "br").await;
    let key = format!("larder:e:http://www.fleet.test{p}");
    let body = body_of(p);
    let complete = eventually(Duration::from_secs(5), async || {
        let v = redis_get(&r, &key).await;
        larder::cache::Entry::decode(v.into())
            .is_ok_and(|e| e.variant(larder::compress::Encoding::Br).is_some())
    })
    .await;
    assert!(complete);

    // Bytes inside the identity body flipped (every length and value still valid); the TTL
    // kept.
    let mut value = redis_get(&r, &key).await;
    let at = (value.windows(body.len()))
        .position(|w| w == body.as_bytes())
        .expect("the identity body is in the record");
    value[at + 10] ^= 0x20;
    value[at + body.len() / 2] ^= 0x20;
    let ttl_before: i64 = r.pttl(&key).await.unwrap();
    redis_set_keep_ttl(&r, &key, value).await;
    let ttl_after: i64 = r.pttl(&key).await.unwrap();
    assert!(ttl_after > 0 && ttl_after <= ttl_before);

    // B never serves the altered bytes, in any encoding: a miss, fetched fresh.
    let hits = origin.hits();
    let g = b.get(&c, p).await;
    assert_body(&g, p);
    assert_eq!(g.cache(), "MISS", "the altered record was not served");
    assert_eq!(origin.hits(), hits + 1, "fetched from the origin");
    for enc in ["identity", "gzip", "br"] {
        let g = get(&c, &b.url(p), &[HOST, ("accept-encoding", enc)]).await;
        assert_body(&g, p);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_fleet_key_nodes_refuse_what_is_not_signed_with_it() {
    use fred::prelude::*;
    let dir = tempfile::tempdir().unwrap();
    let redis = RedisServer::start();
    let origin = origin(600, Duration::ZERO).await;
    let plain = shared_toml(&redis.url());
    let keyed = format!("{plain}shared_key = \"fleet-key-0123456789abcdef\"\n");
    let n = Node::start(dir.path(), "n", origin.addr, &plain);
    let k1 = Node::start(dir.path(), "k1", origin.addr, &keyed);
    let k2 = Node::start(dir.path(), "k2", origin.addr, &keyed);
    let c = client();
    let r = redis_client(&redis.url()).await;
    let key = |p: &str| format!("larder:e:http://www.fleet.test{p}");

    // Written by a node without the key: refused by the nodes with it (fetched fresh).
    assert_body(&n.get(&c, "/unsigned").await, "/unsigned");
    let stored = eventually(Duration::from_secs(5), async || {
        let v: Option<bytes::Bytes> = r.get(key("/unsigned")).await.unwrap();
        v.is_some()
    })
    .await;
    assert!(stored);
    let g = k1.get(&c, "/unsigned").await;
    assert_body(&g, "/unsigned");
    assert_eq!(g.cache(), "MISS", "an unsigned record is refused");
    assert_eq!(origin.hits(), 2);
    assert!(k1.tier(&c, "shared").await["refused"].as_u64().unwrap() >= 1);

    // Written with the key (K1's fill replaced it): served by K2 without the origin.
    let signed = eventually(Duration::from_secs(5), async || {
        redis_get(&r, &key("/unsigned")).await.starts_with(b"LDS1")
    })
    .await;
    assert!(signed, "K1's signed record replaced the unsigned one");
    let g = k2.get(&c, "/unsigned").await;
    assert_body(&g, "/unsigned");
    assert_eq!(
        g.cache(),
        "HIT",
        "a record signed with the fleet key is served"
    );
    assert_eq!(origin.hits(), 2);

    // A signed record copied under another URL's key (one never fetched): refused.
    let copy = redis_get(&r, &key("/unsigned")).await;
    let _: () = r
        .set(key("/never"), copy, Some(Expiration::EX(600)), None, false)
        .await
        .unwrap();
    let refused = k2.tier(&c, "shared").await["refused"].as_u64().unwrap();
    let g = k2.get(&c, "/never").await;
    assert_eq!(g.cache(), "MISS", "a record is bound to its key");
    assert_body(&g, "/never");
    assert_eq!(origin.hits(), 3);
    assert!(k2.tier(&c, "shared").await["refused"].as_u64().unwrap() > refused);
}
