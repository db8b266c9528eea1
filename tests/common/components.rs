//! The real components some tests need beside larder (redis-server, haproxy, an ACME test
//! server, headless Chromium, ...), found where `tests/provision` installs them. Nothing is installed
//! from inside `cargo test`: a test that needs a missing component fails at once with a message
//! naming the command that installs it (`tests/provision`, then `cargo test` again). A test
//! that needs a component gets its path or fails; it never skips.
//!
//! Debian's packages are found on PATH (and the sbin directories); what Go, npm and pip build
//! lives in the tools directory (`$LARDER_TOOLS`, else `~/.cache/larder-tools`: outside the
//! clone, so a fresh clone reuses it). tests/provision holds the versions; a test asking for
//! another one fails and says so.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Where components built or downloaded by tests/provision live (not the system's packages).
pub fn tools_dir() -> PathBuf {
    std::env::var_os("LARDER_TOOLS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let home = std::env::var_os("HOME").unwrap_or_else(|| "/tmp".into());
            Path::new(&home).join(".cache/larder-tools")
        })
}

/// The failure of a test whose component is missing: what is missing, and how to install it.
fn missing(what: &str) -> ! {
    panic!(
        "missing test component: {what}.\n\
         Install every component the tests use with `tests/provision` (as root, or with sudo), \
         then run `cargo test` again."
    )
}

/// The path of `binary` if it is on PATH or in an sbin directory.
pub fn which(binary: &str) -> Option<PathBuf> {
    let path = std::env::var("PATH").unwrap_or_default();
    let found = path
        .split(':')
        .chain(["/usr/sbin", "/sbin", "/usr/local/sbin", "/usr/local/go/bin"])
        .map(|d| Path::new(d).join(binary))
        .find(|p| p.is_file());
    found
}

/// `binary` from Debian's `package`.
pub fn apt(binary: &str, package: &str) -> PathBuf {
    which(binary).unwrap_or_else(|| missing(&format!("`{binary}` (Debian's package {package})")))
}

/// A file that Debian's `package` provides (a module, a data file).
pub fn apt_file(file: &str, package: &str) -> PathBuf {
    let p = PathBuf::from(file);
    if !p.exists() {
        missing(&format!("{file} (Debian's package {package})"));
    }
    p
}

/// The Go toolchain (the machine's, else Debian's golang-go).
pub fn go() -> PathBuf {
    apt("go", "golang-go")
}

/// `binary`, built by `go install module@version` into the tools directory.
pub fn go_install(module_at_version: &str, binary: &str) -> PathBuf {
    let bin = tools_dir().join("go/bin").join(binary);
    let built_from = std::fs::read_to_string(bin.with_extension("version")).unwrap_or_default();
    if !bin.is_file() || built_from.trim() != module_at_version {
        let found = match built_from.trim() {
            "" => "none".to_string(),
            other => format!("one built from {other}"),
        };
        missing(&format!(
            "{} built by `go install {module_at_version}` (found: {found})",
            bin.display()
        ));
    }
    bin
}

/// The directory of an npm package installed (with its dependencies) into the tools directory;
/// node, which runs it, on PATH.
pub fn npm(package: &str, version: &str) -> PathBuf {
    apt("node", "nodejs");
    let dir = tools_dir().join("npm/node_modules").join(package);
    let manifest = std::fs::read(dir.join("package.json")).unwrap_or_default();
    let found = serde_json::from_slice::<serde_json::Value>(&manifest)
        .ok()
        .and_then(|m| m["version"].as_str().map(str::to_string));
    if found.as_deref() != Some(version) {
        missing(&format!(
            "{} from `npm install {package}@{version}` (found version: {found:?})",
            dir.display()
        ));
    }
    dir
}

/// The Python packages tests/provision installs into the tools directory's virtual environment
/// (the same list as its `PIP_PACKAGES`): one set, one marker.
pub const PIP_PACKAGES: &[&str] = &[
    "prometheus-client==0.21.1",
    "PyJWT==2.10.1",
    "cryptography==44.0.0",
];

/// The Python interpreter of the virtual environment in the tools directory, which holds
/// `packages` (pip names with versions, from PyPI).
pub fn pip(packages: &[&str]) -> PathBuf {
    let venv = tools_dir().join("venv");
    let python = venv.join("bin/python");
    let marker = venv.join(format!(".{}", packages.join("+").replace(['/', '='], "_")));
    if !python.is_file() || !marker.is_file() {
        missing(&format!(
            "a Python virtual environment at {} with `pip install {}` ({} not found)",
            venv.display(),
            packages.join(" "),
            marker.display()
        ));
    }
    python
}

/// The cargo-deb version tests/provision installs (its `CARGO_DEB_VERSION`).
pub const CARGO_DEB_VERSION: &str = "3.8.0";

/// A directory holding `cargo-deb` (cargo install'ed into the tools directory), to put on
/// PATH so that `cargo deb` finds it.
pub fn cargo_deb_dir() -> PathBuf {
    let bin = tools_dir().join("cargo/bin");
    let version = std::fs::read_to_string(bin.join("cargo-deb.version")).unwrap_or_default();
    if !bin.join("cargo-deb").is_file() || version.trim() != CARGO_DEB_VERSION {
        missing(&format!(
            "cargo-deb {CARGO_DEB_VERSION} in {} (cargo install)",
            bin.display()
        ));
    }
    bin
}

/// redis-server from Debian's packages (redis-cli comes with it, in redis-tools).
pub fn redis_server_binary() -> PathBuf {
    apt("redis-server", "redis-server")
}

pub fn redis_cli() -> PathBuf {
    apt("redis-cli", "redis-tools")
}

/// A redis-server of the test's own on a free loopback port, nothing persisted; killed when
/// dropped.
pub struct RedisServer {
    pub port: u16,
    child: Option<std::process::Child>,
    args: Vec<String>,
    dir: tempfile::TempDir,
}

impl RedisServer {
    pub fn start() -> RedisServer {
        RedisServer::start_with(&[])
    }

    /// A server with more arguments (`--cluster-enabled yes`, ...).
    pub fn start_with(args: &[&str]) -> RedisServer {
        let port = super::free_port().port();
        let mut r = RedisServer {
            port,
            child: None,
            args: args.iter().map(|a| a.to_string()).collect(),
            dir: tempfile::tempdir().unwrap(),
        };
        r.restart();
        r
    }

    /// Starts it (again, after [`RedisServer::kill`]) on the same port.
    pub fn restart(&mut self) {
        let child = Command::new(redis_server_binary())
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(self.dir.path())
            .args(&self.args)
            .arg("--logfile")
            .arg(self.dir.path().join("redis.log"))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("start redis-server");
        self.child = Some(child);
        for _ in 0..200 {
            if self.cli(&["ping"]).trim() == "PONG" {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(25));
        }
        panic!(
            "redis-server did not start on port {}: {}",
            self.port,
            std::fs::read_to_string(self.dir.path().join("redis.log")).unwrap_or_default()
        );
    }

    /// Kills it (as a crash would).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// What redis-cli prints for a command to this server.
    pub fn cli(&self, args: &[&str]) -> String {
        let out = Command::new(redis_cli())
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(args)
            .output()
            .expect("run redis-cli");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A Redis Cluster of `n` masters (no replicas), every slot assigned, its state ok.
pub fn redis_cluster(n: usize) -> Vec<RedisServer> {
    let nodes: Vec<RedisServer> = (0..n)
        .map(|_| {
            RedisServer::start_with(&[
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-node-timeout",
                "2000",
            ])
        })
        .collect();
    let addrs: Vec<String> = nodes
        .iter()
        .map(|r| format!("127.0.0.1:{}", r.port))
        .collect();
    let out = Command::new(redis_cli())
        .args(["--cluster", "create"])
        .args(&addrs)
        .args(["--cluster-replicas", "0", "--cluster-yes"])
        .output()
        .expect("run redis-cli --cluster create");
    assert!(
        out.status.success(),
        "redis-cli --cluster create: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    for _ in 0..400 {
        if nodes
            .iter()
            .all(|r| r.cli(&["cluster", "info"]).contains("cluster_state:ok"))
        {
            return nodes;
        }
        std::thread::sleep(std::time::Duration::from_millis(25));
    }
    panic!("the cluster did not come up");
}

/// haproxy from Debian's packages.
pub fn haproxy_binary() -> PathBuf {
    apt("haproxy", "haproxy")
}

/// An haproxy of the test's own, in the foreground, running the configuration the test wrote;
/// killed when dropped.
pub struct Haproxy {
    /// Where its frontend listens (`{listen}` in the configuration).
    pub addr: std::net::SocketAddr,
    child: std::process::Child,
    _dir: tempfile::TempDir,
}

impl Haproxy {
    /// Starts haproxy with `config`, whose `{listen}` is replaced by a free loopback address
    /// (its frontend's `bind`); returns once that address accepts connections. A configuration
    /// haproxy refuses fails the test with haproxy's words.
    pub fn start(config: &str) -> Haproxy {
        let addr = super::free_port();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("haproxy.cfg");
        std::fs::write(&path, config.replace("{listen}", &addr.to_string())).unwrap();
        let check = Command::new(haproxy_binary())
            .args(["-c", "-q", "-f"])
            .arg(&path)
            .output()
            .expect("run haproxy -c");
        assert!(
            check.status.success(),
            "haproxy refuses the configuration: {}{}",
            String::from_utf8_lossy(&check.stdout),
            String::from_utf8_lossy(&check.stderr)
        );
        let child = Command::new(haproxy_binary())
            // -db: in the foreground, not as a daemon (killed with the test).
            .args(["-db", "-f"])
            .arg(&path)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("start haproxy");
        let h = Haproxy {
            addr,
            child,
            _dir: dir,
        };
        for _ in 0..400 {
            if std::net::TcpStream::connect(addr).is_ok() {
                return h;
            }
            std::thread::sleep(std::time::Duration::from_millis(25));
        }
        panic!("haproxy did not listen on {addr}");
    }
}

impl Drop for Haproxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
