//! The command line: which configuration to run (a file, the embedded default, or one built from
//! flags), how the process logs (`--log-format`, `--log-level`), the version line (with the
//! commit and build date build.rs sets), and the subcommands; shell completion scripts and the
//! man page, generated from this same definition (clap_complete, clap_mangen).

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{ArgGroup, CommandFactory, Parser, Subcommand};

use crate::config::{
    self, Config, HandlerConfig, ImagesConfig, ProxyConfig, PushConfig, StaticConfig, TlsConfig,
};

/// `larder --version`: the package version, the commit built and the build date (UTC), as
/// `larder 0.1.0 (abc1234 2026-11-27)`; the commit is "unknown" when built outside a git
/// checkout (build.rs).
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (",
    env!("LARDER_COMMIT"),
    " ",
    env!("LARDER_BUILD_DATE"),
    ")"
);

/// The process log's format and level: the same settings as `[server] log_format` and
/// `log_level`, which the flags override.
pub use crate::config::{LogLevel, ProcessLogFormat as LogFormat};

#[derive(Debug, Parser)]
#[command(
    name = "larder",
    version = VERSION,
    about = "A web accelerator: caching reverse proxy, static files",
    // Exclusive by their own conflicts (--images and --image-origin go together).
    group(ArgGroup::new("quick").args(["upstream", "root", "images", "image_origin", "push"]).multiple(true)),
    group(ArgGroup::new("image_route").args(["images", "image_origin"]).multiple(true))
)]
pub struct Cli {
    /// Run from this TOML configuration file.
    #[arg(long, short, value_name = "FILE", conflicts_with_all = ["upstream", "root", "images", "image_origin", "push"])]
    pub config: Option<PathBuf>,
    /// Cache this origin (http://host:port or https://) with no configuration file; given
    /// more than once, a round-robin pool of them with a health check, failing over.
    #[arg(long, value_name = "URL", conflicts_with_all = ["root", "images", "image_origin", "push"])]
    pub upstream: Vec<String>,
    /// Serve this directory as static files with no configuration file.
    #[arg(long, value_name = "DIR", conflicts_with_all = ["images", "image_origin", "push"])]
    pub root: Option<PathBuf>,
    /// Run the image server (upload, zimg-style transforms) storing originals in this directory,
    /// with no configuration file.
    #[arg(long, value_name = "DIR", conflicts_with = "push")]
    pub images: Option<PathBuf>,
    /// Run the image proxy at `/` (imgproxy's, thumbor's and zimg's URLs) with originals
    /// fetched from this base URL (http://host:port or https://, a path prefix allowed), with
    /// no configuration file; uploads only with --images too.
    #[arg(long, value_name = "URL", conflicts_with = "push")]
    pub image_origin: Option<String>,
    /// imgproxy's signing key (hex, imgproxy's IMGPROXY_KEY), with --image-salt: unsigned
    /// imgproxy URLs then get 403.
    #[arg(long, value_name = "HEX", requires_all = ["image_salt", "image_route"])]
    pub image_key: Option<String>,
    /// imgproxy's signing salt (hex, imgproxy's IMGPROXY_SALT), with --image-key.
    #[arg(long, value_name = "HEX", requires = "image_key")]
    pub image_salt: Option<String>,
    /// thumbor's security key (thumbor's SECURITY_KEY): thumbor URLs must then be signed.
    #[arg(long, value_name = "KEY", requires = "image_route")]
    pub thumbor_key: Option<String>,
    /// Serve live JSON records (PUT/PATCH/DELETE, subscribe over SSE or WebSocket) stored in
    /// this directory, with no configuration file.
    #[arg(long, value_name = "DIR")]
    pub push: Option<PathBuf>,
    /// The bearer token that writes to --push records need; without it one is generated and
    /// printed.
    #[arg(long, value_name = "TOKEN", requires = "push")]
    pub push_token: Option<String>,
    /// Keep a disk tier of the cache in this directory (1 GiB; `[cache.disk]` in a file sets
    /// more): the cache survives restarts. With --upstream.
    #[arg(long, value_name = "DIR", requires = "upstream")]
    pub disk: Option<PathBuf>,
    /// Share the cache with every node using this Redis or Valkey (redis://host:port, or
    /// redis+cluster://host:port,host:port,... for a cluster). With --upstream.
    #[arg(long, value_name = "URL", requires = "upstream")]
    pub shared: Option<String>,
    /// The fleet key of --shared (at least 16 bytes, the same on every node): nodes sign what
    /// they write to Redis and refuse what is not signed with it (`shared_key` in a file keeps
    /// it out of the process list).
    #[arg(long, value_name = "KEY", requires = "shared")]
    pub shared_key: Option<String>,
    /// Address to listen on with --upstream, --root, --images, --image-origin or --push.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    /// Serve HTTPS on --listen with this certificate chain (PEM), with --tls-key.
    #[arg(long, value_name = "FILE", requires_all = ["tls_key", "quick"], conflicts_with = "tls_self_signed")]
    pub tls_cert: Option<PathBuf>,
    /// The private key (PEM) of --tls-cert.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Serve HTTPS on --listen with a self-signed certificate for localhost, made once and kept
    /// under --state-dir (its path is printed, for `curl --cacert`).
    #[arg(long, requires = "quick")]
    pub tls_self_signed: bool,
    /// Also serve HTTP/3 (QUIC) on --listen's port over UDP, with --tls-cert or
    /// --tls-self-signed (`http3 = true` in `[listener.tls]`).
    #[arg(long, requires = "quick")]
    pub http3: bool,
    /// Where larder keeps what it makes (the self-signed certificate); overrides
    /// `[server] state_dir` (default `larder-state`).
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// Serve the admin API (status, purge, /metrics) on this address, beside any other flags
    /// (bind it to loopback unless the network in front is trusted).
    #[arg(long, value_name = "ADDR")]
    pub admin: Option<SocketAddr>,
    /// The admin API's bearer token; with --admin and none given, one is generated and printed.
    #[arg(long, value_name = "TOKEN", requires = "admin")]
    pub admin_token: Option<String>,
    /// Worker threads, 0 to 1024 (overrides the configuration; 0 = one per core).
    #[arg(long, value_name = "N")]
    pub workers: Option<config::Workers>,
    /// The process log's format: `text` (coloured only on a terminal, never with NO_COLOR set)
    /// or `json` (one object a line); overrides `[server] log_format` (default `text`).
    #[arg(long, value_name = "FORMAT", value_enum, global = true)]
    pub log_format: Option<LogFormat>,
    /// The process log's level (error, warn, info, debug, trace); overrides `[server]
    /// log_level`; without either RUST_LOG is honoured (a level or tracing filter directives
    /// such as `larder=debug`), else `info`.
    #[arg(long, value_name = "LEVEL", value_enum, global = true)]
    pub log_level: Option<LogLevel>,
    #[command(subcommand)]
    pub command: Option<Command>,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Validate a configuration file and exit.
    Check {
        /// The file to check.
        file: PathBuf,
    },
    /// Live statistics of a running larder from its admin API (like varnishstat): rates and
    /// totals refreshed every second.
    Stats {
        /// The admin listener's address.
        #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:9090")]
        admin: SocketAddr,
        /// The admin token (or the environment variable LARDER_ADMIN_TOKEN).
        #[arg(long, value_name = "TOKEN", env = "LARDER_ADMIN_TOKEN")]
        token: String,
        /// Print once and exit.
        #[arg(long)]
        once: bool,
        /// Print the admin API's status JSON as it is (with --once, for scripts).
        #[arg(long)]
        json: bool,
    },
    /// Reload the running larder's configuration file through its admin API (as SIGHUP does):
    /// the new file is checked first, and a bad one is refused with the reason.
    Reload {
        /// The admin listener's address.
        #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:9090")]
        admin: SocketAddr,
        /// The admin token (or the environment variable LARDER_ADMIN_TOKEN).
        #[arg(long, value_name = "TOKEN", env = "LARDER_ADMIN_TOKEN")]
        token: String,
    },
    /// Check that a running larder answers: `GET PATH` on ADDR (plain HTTP), exit status 0 on
    /// a 2xx or 3xx answer within the timeout, 1 otherwise (a container's HEALTHCHECK).
    Probe {
        /// The listener's address.
        #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8080")]
        addr: SocketAddr,
        /// The path asked for.
        #[arg(long, value_name = "PATH", default_value = "/ping")]
        path: String,
        /// The longest wait for the answer's head, in milliseconds.
        #[arg(long, value_name = "MS", default_value_t = 2000)]
        timeout_ms: u64,
    },
    /// Print the completion script of a shell for larder (packages install it, e.g. bash's
    /// into /usr/share/bash-completion/completions/larder).
    Completions {
        /// The shell: bash, zsh, fish, elvish or powershell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print larder's manual page (roff, section 1): `larder manpage > larder.1`, or read it
    /// at once with `larder manpage | man -l -`.
    Manpage,
}

/// Writes the completion script of `shell` for the whole command line (subcommands, flags,
/// their values) to `out`.
pub fn write_completions(shell: clap_complete::Shell, out: &mut dyn std::io::Write) {
    clap_complete::generate(shell, &mut Cli::command(), "larder", out);
}

/// Writes the man page (roff) of the command line to `out`: every flag and subcommand with
/// the help text above.
pub fn write_manpage(out: &mut dyn std::io::Write) -> std::io::Result<()> {
    clap_mangen::Man::new(Cli::command()).render(out)
}

/// Which configuration a command line selects.
pub enum Source {
    Embedded,
    File(PathBuf),
    Flags,
}

impl Cli {
    /// The configuration to run, and where it came from.
    pub fn config(&self) -> Result<(Config, Source), config::Error> {
        let (mut cfg, source) = if let Some(path) = &self.config {
            (Config::load(path)?, Source::File(path.clone()))
        } else if !self.upstream.is_empty() {
            let upstreams = (self.upstream.iter())
                .map(|up| up.parse())
                .collect::<Result<Vec<_>, _>>()
                .map_err(|message| config::Error::Semantic {
                    origin: "--upstream".into(),
                    message,
                })?;
            (
                Config::single_route(
                    self.listen,
                    HandlerConfig::Proxy(ProxyConfig::pool_of(upstreams)),
                ),
                Source::Flags,
            )
        } else if let Some(root) = &self.root {
            (
                Config::single_route(
                    self.listen,
                    HandlerConfig::Static(StaticConfig::new_root(root.clone())),
                ),
                Source::Flags,
            )
        } else if self.images.is_some() || self.image_origin.is_some() {
            (
                Config::single_route(
                    self.listen,
                    HandlerConfig::Images(Box::new(self.image_route()?)),
                ),
                Source::Flags,
            )
        } else if let Some(dir) = &self.push {
            let mut p = PushConfig::new_dir(dir.clone(), self.push_token.clone());
            p.demo = true;
            (
                Config::single_route(self.listen, HandlerConfig::Push(Box::new(p))),
                Source::Flags,
            )
        } else {
            (
                Config::parse(config::EMBEDDED_DEFAULT, "embedded default")?,
                Source::Embedded,
            )
        };
        if let Some(dir) = &self.disk {
            cfg.cache.disk = Some(config::DiskConfig::at(dir.clone()));
        }
        if let Some(url) = &self.shared {
            let mut shared = config::SharedConfig::at(url.clone());
            shared.shared_key = self.shared_key.clone();
            shared.check().map_err(|message| config::Error::Semantic {
                origin: "--shared".into(),
                message,
            })?;
            cfg.cache.shared = Some(shared);
        }
        if let Some(w) = self.workers {
            cfg.server.workers = w;
        }
        if let Some(dir) = &self.state_dir {
            cfg.set_state_dir(dir.clone());
        }
        if let Some(f) = self.log_format {
            cfg.server.log_format = f;
        }
        if let Some(l) = self.log_level {
            cfg.server.log_level = Some(l);
        }
        if let Some(addr) = self.admin {
            cfg.admin.listen = Some(addr);
            if let Some(t) = &self.admin_token {
                cfg.admin.token = Some(t.clone());
            }
        }
        if let (Some(cert), Some(key)) = (&self.tls_cert, &self.tls_key) {
            let mut tls = TlsConfig::single(cert.clone(), key.clone());
            tls.http3 = self.http3;
            cfg.listeners[0].tls = Some(tls);
        }
        if self.http3 && self.tls_cert.is_none() && !self.tls_self_signed {
            return Err(config::Error::Semantic {
                origin: "command line".into(),
                message: "--http3 needs HTTPS: --tls-cert and --tls-key, or --tls-self-signed"
                    .into(),
            });
        }
        Ok((cfg, source))
    }

    /// The image route of `--images` and `--image-origin`, with the keys of `--image-key`,
    /// `--image-salt` and `--thumbor-key`.
    fn image_route(&self) -> Result<ImagesConfig, config::Error> {
        let refused = |flag: &str, message: String| config::Error::Semantic {
            origin: flag.into(),
            message,
        };
        let mut i = match &self.image_origin {
            Some(url) => {
                url.parse::<config::Upstream>()
                    .map_err(|m| refused("--image-origin", m))?;
                ImagesConfig::new_origin(url.clone())
            }
            None => ImagesConfig::new_dir(PathBuf::new()),
        };
        i.dir = self.images.clone();
        if let (Some(key), Some(salt)) = (&self.image_key, &self.image_salt) {
            for (flag, v) in [("--image-key", key), ("--image-salt", salt)] {
                if v.is_empty() || v.len() % 2 != 0 || !v.bytes().all(|b| b.is_ascii_hexdigit()) {
                    return Err(refused(
                        flag,
                        format!("`{v}` is not hex: an even number of digits 0-9, a-f"),
                    ));
                }
            }
            i.imgproxy.keys = vec![config::KeyPair {
                key: key.clone(),
                salt: salt.clone(),
            }];
        }
        if let Some(k) = &self.thumbor_key {
            if k.is_empty() {
                return Err(refused("--thumbor-key", "is empty".into()));
            }
            i.thumbor.key = Some(k.clone());
        }
        Ok(i)
    }

    /// With `--admin` and no token from the flags or the file: a new random token, set in
    /// `cfg` and returned (to be printed).
    pub fn generated_admin_token(&self, cfg: &mut Config) -> Option<String> {
        if self.admin.is_none() || cfg.admin.token.as_deref().is_some_and(|t| !t.is_empty()) {
            return None;
        }
        let token = random_token()?;
        cfg.admin.token = Some(token.clone());
        Some(token)
    }

    /// Push routes of the embedded default or of `--push` with no write token get a new
    /// random one (returned with the route's path, to be printed). A configuration file's
    /// routes are left as written (without a token, their writes are refused).
    pub fn generated_push_tokens(
        &self,
        cfg: &mut Config,
        source: &Source,
    ) -> Vec<(String, String)> {
        if matches!(source, Source::File(_)) {
            return Vec::new();
        }
        let mut out = Vec::new();
        for l in &mut cfg.listeners {
            for r in &mut l.routes {
                let HandlerConfig::Push(p) = &mut r.handler else {
                    continue;
                };
                if p.token.is_some() || p.jwt.is_some() {
                    continue;
                }
                let Some(token) = random_token() else {
                    continue;
                };
                p.token = Some(token.clone());
                out.push((format!("http://{}{}", l.addr, r.path.0), token));
            }
        }
        out
    }

    /// With `--tls-self-signed`: makes (once) the certificate and key under the state
    /// directory and serves them on the quick start's listener; returns the certificate's path.
    pub fn self_signed(&self, cfg: &mut Config) -> Result<Option<PathBuf>, crate::tls::Error> {
        if !self.tls_self_signed {
            return Ok(None);
        }
        let (cert, key) = crate::tls::self_signed(&cfg.server.state_dir.join("tls"))?;
        let mut tls = TlsConfig::single(cert.clone(), key);
        tls.http3 = self.http3;
        cfg.listeners[0].tls = Some(tls);
        Ok(Some(cert))
    }
}

/// 24 random bytes in hex.
fn random_token() -> Option<String> {
    let mut bytes = [0u8; 24];
    crate::tls::provider().secure_random.fill(&mut bytes).ok()?;
    Some(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http3_flag_turns_quic_on_for_the_quick_start_tls() {
        let cli = Cli::parse_from([
            "larder",
            "--upstream",
            "http://127.0.0.1:1",
            "--tls-cert",
            "c.pem",
            "--tls-key",
            "k.pem",
            "--http3",
        ]);
        let (cfg, _) = cli.config().unwrap();
        assert!(cfg.listeners[0].tls.as_ref().unwrap().http3);
        let plain = Cli::parse_from(["larder", "--upstream", "http://127.0.0.1:1", "--http3"]);
        let e = plain.config().err().expect("refused").to_string();
        assert!(e.contains("--http3 needs HTTPS"), "{e}");
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().to_str().unwrap();
        let cli = Cli::parse_from([
            "larder",
            "--upstream",
            "http://127.0.0.1:1",
            "--tls-self-signed",
            "--http3",
            "--state-dir",
            state,
        ]);
        let (mut cfg, _) = cli.config().unwrap();
        cli.self_signed(&mut cfg).unwrap();
        assert!(cfg.listeners[0].tls.as_ref().unwrap().http3);
    }

    #[test]
    fn images_flag_runs_the_image_server() {
        let cli = Cli::parse_from(["larder", "--images", "./imgs", "--listen", "127.0.0.1:9"]);
        let (cfg, _) = cli.config().unwrap();
        assert_eq!(cfg.listeners[0].addr, "127.0.0.1:9".parse().unwrap());
        assert!(matches!(
            &cfg.listeners[0].routes[0].handler,
            HandlerConfig::Images(i) if i.dir.as_deref() == Some(std::path::Path::new("./imgs"))
        ));
        assert!(Cli::try_parse_from(["larder", "--images", "a", "--root", "b"]).is_err());
    }

    #[test]
    fn image_origin_runs_the_image_proxy_with_its_keys() {
        let cfg = |args: &[&str]| {
            let mut all = vec!["larder"];
            all.extend_from_slice(args);
            Cli::try_parse_from(all)
                .map_err(|e| e.to_string())
                .and_then(|cli| cli.config().map(|c| c.0).map_err(|e| e.to_string()))
        };
        let images = |c: &Config| match &c.listeners[0].routes[0].handler {
            HandlerConfig::Images(i) => i.clone(),
            _ => panic!("an image route"),
        };
        let c = cfg(&[
            "--image-origin",
            "http://127.0.0.1:3000",
            "--listen",
            "127.0.0.1:9",
        ])
        .unwrap();
        let i = images(&c);
        assert_eq!(c.listeners[0].routes[0].path.0, "/");
        assert_eq!(i.origin.as_deref(), Some("http://127.0.0.1:3000"));
        assert_eq!(i.dir, None);
        assert!(i.imgproxy.keys.is_empty() && i.thumbor.key.is_none());
        let c = cfg(&[
            "--image-origin",
            "https://img.example.com/photos/",
            "--images",
            "./up",
            "--image-key",
            "943b421c9eb07c83",
            "--image-salt",
            "520f986b998545b4",
            "--thumbor-key",
            "MY_KEY",
        ])
        .unwrap();
        let i = images(&c);
        assert_eq!(i.dir.as_deref(), Some(std::path::Path::new("./up")));
        assert_eq!(i.imgproxy.keys[0].key, "943b421c9eb07c83");
        assert_eq!(i.imgproxy.keys[0].salt, "520f986b998545b4");
        assert_eq!(i.thumbor.key.as_deref(), Some("MY_KEY"));
        let e = cfg(&[
            "--image-origin",
            "http://x",
            "--image-key",
            "zz",
            "--image-salt",
            "00",
        ]);
        assert!(e.unwrap_err().contains("--image-key: `zz` is not hex"));
        let e = cfg(&[
            "--image-origin",
            "http://x",
            "--image-key",
            "abc",
            "--image-salt",
            "00",
        ]);
        assert!(e.unwrap_err().contains("not hex"));
        let e = cfg(&["--image-origin", "ftp://x"]).unwrap_err();
        assert!(e.contains("--image-origin") && e.contains("http://"), "{e}");
        // A key without its salt, or without an image route, is refused by the parser.
        assert!(cfg(&["--image-origin", "http://x", "--image-key", "00"]).is_err());
        assert!(cfg(&["--upstream", "http://x", "--thumbor-key", "k"]).is_err());
        assert!(cfg(&["--image-origin", "http://x", "--upstream", "http://y"]).is_err());
    }
}
