//! The real components some tests need beside larder (redis-server, an ACME test server,
//! headless Chromium, nginx modules, ...), installed by the test setup itself when they are
//! missing, so that `cargo test` in a fresh clone passes on a fresh machine. A test that needs a
//! component calls one of these and gets its path, or fails loudly: it never skips.
//!
//! Installs go to Debian's packages (`apt-get`, as root), Go's module proxy (`go install`) and
//! npm, each serialized across test binaries by one `flock` on a file under the tools directory
//! (`$LARDER_TOOLS`, else `~/.cache/larder-tools`: outside the clone, so repeat runs are quick).

use std::path::{Path, PathBuf};
use std::process::Command;

/// Where components built or downloaded by the tests live (not the system's packages).
pub fn tools_dir() -> PathBuf {
    let dir = std::env::var_os("LARDER_TOOLS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let home = std::env::var_os("HOME").unwrap_or_else(|| "/tmp".into());
            Path::new(&home).join(".cache/larder-tools")
        });
    std::fs::create_dir_all(&dir).expect("create the tools directory");
    dir
}

/// Runs `script` with `sh -c` while holding the tools lock; panics with its output on failure.
fn locked(script: &str) {
    let lock = tools_dir().join(".lock");
    let out = Command::new("flock")
        .arg(&lock)
        .arg("sh")
        .arg("-c")
        .arg(script)
        .output()
        .expect("run flock (util-linux)");
    assert!(
        out.status.success(),
        "installing a test component failed: {script}\nstdout:\n{}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
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

/// `binary` from Debian's `package`, installed with apt-get if missing.
pub fn apt(binary: &str, package: &str) -> PathBuf {
    if let Some(p) = which(binary) {
        return p;
    }
    locked(&format!(
        "command -v {binary} >/dev/null 2>&1 || {{ \
           export DEBIAN_FRONTEND=noninteractive; \
           apt-get -o DPkg::Lock::Timeout=600 install -y -qq {package} >/dev/null 2>&1 || \
           {{ apt-get -o DPkg::Lock::Timeout=600 update -qq && apt-get -o DPkg::Lock::Timeout=600 install -y -qq {package}; }}; }}"
    ));
    which(binary).unwrap_or_else(|| panic!("{package} installed but {binary} not found"))
}

/// A file that Debian's `package` provides (a module, a data file), installed if missing.
pub fn apt_file(file: &str, package: &str) -> PathBuf {
    let p = PathBuf::from(file);
    if !p.exists() {
        locked(&format!(
            "test -e {file} || {{ export DEBIAN_FRONTEND=noninteractive; \
               apt-get -o DPkg::Lock::Timeout=600 install -y -qq {package} >/dev/null 2>&1 || \
               {{ apt-get -o DPkg::Lock::Timeout=600 update -qq && apt-get -o DPkg::Lock::Timeout=600 install -y -qq {package}; }}; }}"
        ));
    }
    assert!(p.exists(), "{package} installed but {file} not found");
    p
}

/// The Go toolchain (the machine's, else Debian's golang-go).
pub fn go() -> PathBuf {
    which("go").unwrap_or_else(|| apt("go", "golang-go"))
}

/// `binary` built by `go install module@version` into the tools directory.
pub fn go_install(module_at_version: &str, binary: &str) -> PathBuf {
    let bin_dir = tools_dir().join("go/bin");
    let bin = bin_dir.join(binary);
    if !bin.is_file() {
        let go = go();
        let (gopath, gocache) = (tools_dir().join("go/path"), tools_dir().join("go/cache"));
        locked(&format!(
            "test -x {bin} || GOBIN={bin_dir} GOPATH={gopath} GOCACHE={gocache} GOFLAGS=-mod=mod {go} install {module_at_version}",
            bin = bin.display(),
            bin_dir = bin_dir.display(),
            gopath = gopath.display(),
            gocache = gocache.display(),
            go = go.display(),
        ));
    }
    assert!(
        bin.is_file(),
        "go install {module_at_version} made no {binary}"
    );
    bin
}

/// The directory of an npm package installed (with its dependencies) into the tools directory.
pub fn npm(package: &str, version: &str) -> PathBuf {
    let prefix = tools_dir().join("npm");
    let dir = prefix.join("node_modules").join(package);
    if !dir.join("package.json").is_file() {
        let npm = which("npm").unwrap_or_else(|| apt("npm", "npm"));
        locked(&format!(
            "test -f {dir}/package.json || {npm} install --silent --no-audit --no-fund --prefix {prefix} {package}@{version}",
            dir = dir.display(),
            npm = npm.display(),
            prefix = prefix.display(),
        ));
    }
    assert!(
        dir.is_dir(),
        "npm install {package}@{version} made no {}",
        dir.display()
    );
    dir
}

/// The Python interpreter of a virtual environment in the tools directory holding `packages`
/// (pip names with versions, from PyPI).
pub fn pip(packages: &[&str]) -> PathBuf {
    let venv = tools_dir().join("venv");
    let python = venv.join("bin/python");
    let marker = venv.join(format!(".{}", packages.join("+").replace(['/', '='], "_")));
    if !marker.is_file() {
        let python3 = which("python3").unwrap_or_else(|| apt("python3", "python3"));
        locked(&format!(
            "test -f {marker} || {{ {{ test -x {python} || {python3} -m venv {venv} || \
               {{ apt-get -o DPkg::Lock::Timeout=600 install -y -qq python3-venv >/dev/null && {python3} -m venv {venv}; }}; }} && \
               {python} -m pip install -q --disable-pip-version-check {pkgs} && touch {marker}; }}",
            marker = marker.display(),
            python = python.display(),
            python3 = python3.display(),
            venv = venv.display(),
            pkgs = packages.join(" "),
        ));
    }
    assert!(
        python.is_file(),
        "no virtual environment at {}",
        venv.display()
    );
    python
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
