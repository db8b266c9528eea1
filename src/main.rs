//! The larder binary: parse the command line, set up the process log, load the configuration,
//! run until a signal, as a service (the PID file, root given up after binding, systemd told
//! of readiness and stop); or print the shell completions or the man page. Errors are printed
//! as `error: ...` on stderr (as cargo and rustc do).

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::Parser;
use larder::cli::{Cli, Command, LogFormat, LogLevel, Source};
use larder::config::Config;
use larder::server;
use larder::service;

/// jemalloc, not glibc's malloc: see docs/design.md "Allocator". The library leaves the
/// allocator to its binary (its tests count heap bytes with allocators of their own).
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// The process log, on standard output: `--log-level` (or `[server] log_level`), else
/// RUST_LOG, else `info`; text coloured only when standard output is a terminal and NO_COLOR is
/// unset or empty (no-color.org), or JSON (one object a line).
fn init_log(format: LogFormat, level: Option<LogLevel>) {
    use tracing_subscriber::EnvFilter;
    let filter = match level {
        Some(level) => EnvFilter::new(level.as_str()),
        None => EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false);
    match format {
        LogFormat::Json => builder.json().with_ansi(false).init(),
        LogFormat::Text => {
            let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
            builder
                .with_ansi(std::io::stdout().is_terminal() && !no_color)
                .init()
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // What is printed from the command line's definition alone, before any log is set up.
    match &cli.command {
        Some(Command::Completions { shell }) => {
            larder::cli::write_completions(*shell, &mut std::io::stdout());
            return ExitCode::SUCCESS;
        }
        Some(Command::Manpage) => {
            return match larder::cli::write_manpage(&mut std::io::stdout()) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("error: {e}");
                    ExitCode::FAILURE
                }
            };
        }
        _ => {}
    }
    // The subcommands log with the flags' settings; a run with its configuration's (below).
    if cli.command.is_some() {
        init_log(cli.log_format.unwrap_or_default(), cli.log_level);
    }

    if let Some(Command::Stats {
        admin,
        token,
        once,
        json,
    }) = &cli.command
    {
        let rt = match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(rt) => rt,
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::FAILURE;
            }
        };
        return match rt.block_on(larder::stats::run(*admin, token, *once, *json)) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::FAILURE
            }
        };
    }
    if let Some(Command::Probe {
        addr,
        path,
        timeout_ms,
    }) = &cli.command
    {
        let Ok(rt) = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        else {
            return ExitCode::FAILURE;
        };
        let timeout = std::time::Duration::from_millis(*timeout_ms);
        return match rt.block_on(larder::stats::probe(*addr, path, timeout)) {
            Ok(said) => {
                println!("{said}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::FAILURE
            }
        };
    }
    if let Some(Command::Reload { admin, token }) = &cli.command {
        let rt = match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(rt) => rt,
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::FAILURE;
            }
        };
        return match rt.block_on(larder::stats::reload(*admin, token)) {
            Ok(said) => {
                println!("{said}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::FAILURE
            }
        };
    }
    if let Some(Command::Check { file }) = &cli.command {
        // The open-files limit is checked as `run` would, on this machine.
        let checked = Config::load(file)
            .map_err(|e| e.to_string())
            .and_then(|mut cfg| {
                let fit = server::fit_open_files(&mut cfg).map_err(|e| e.to_string())?;
                // Certificates are read as starting would read them.
                larder::tls::check(&cfg).map_err(|e| e.to_string())?;
                // So are the pools' CA and client certificates.
                larder::upstream::Pools::build(&cfg.pools, None)?;
                Ok((cfg, fit))
            });
        return match checked {
            Ok((cfg, fit)) => {
                if let Some(n) = fit.and_then(|f| f.lowered_to) {
                    println!("note: max_connections lowered from its default to {n}, what the open-files limit here allows");
                }
                println!(
                    "{}: ok ({} listener(s), {} route(s))",
                    file.display(),
                    cfg.listeners.len(),
                    cfg.listeners.iter().map(|l| l.routes.len()).sum::<usize>()
                );
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::from(2)
            }
        };
    }

    let (mut cfg, source) = match cli.config() {
        Ok(x) => x,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    init_log(cfg.server.log_format, cfg.server.log_level);
    let json_log = cfg.server.log_format == LogFormat::Json;
    // What larder tells the operator at start (tokens, URLs, what to try): printed as lines of
    // their own, or as log events when the log is JSON (so every line of it parses).
    let say = move |line: String| {
        if json_log {
            tracing::info!("{line}");
        } else {
            println!("{line}");
        }
    };
    let (user, group, pid_path) = (
        cfg.server.user.clone(),
        cfg.server.group.clone(),
        cfg.server.pid_file.clone(),
    );
    let generated_token = cli.generated_admin_token(&mut cfg);
    let push_tokens = cli.generated_push_tokens(&mut cfg, &source);
    let self_signed = match cli.self_signed(&mut cfg) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let zero_copy_min = cfg.cache.zero_copy_min.0 as usize;
    match server::fit_open_files(&mut cfg) {
        Ok(Some(f)) => {
            tracing::info!(old = f.old, new = f.new, "open-files limit");
            // Large bodies' memory files, in the descriptors the connections leave over.
            let files = cfg.zero_copy_files(f.new);
            larder::mapped::configure(zero_copy_min, files as usize);
            if zero_copy_min > 0 && files < cfg.cache.zero_copy_files.get() as u64 {
                tracing::info!(
                    zero_copy_files = files,
                    "fewer large bodies sent without a copy: the open-files limit leaves room                      for {files} beside max_connections"
                );
            }
            // Only the default is ever lowered (a `max_connections` set above the limit is
            // refused): nothing for the operator to act on, so not a warning.
            if let Some(n) = f.lowered_to {
                tracing::info!(
                    max_connections = n,
                    "max_connections lowered from its default to fit the open-files limit"
                );
            }
        }
        Ok(None) => {
            tracing::warn!("cannot read the open-files limit");
            larder::mapped::configure(zero_copy_min, 0);
        }
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    }
    let rt = match server::runtime(&cfg.server) {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let schemes: Vec<&str> = (cfg.listeners.iter())
        .map(|l| if l.tls.is_some() { "https" } else { "http" })
        .collect();
    rt.block_on(async move {
        let handle = match server::start(cfg).await {
            Ok(h) => h,
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::FAILURE;
            }
        };
        // Listening: the PID file is written (while still root, where /run is writable), then
        // root is given up for `[server] user`; failing that, larder does not run on.
        let _pid_file = match &pid_path {
            None => None,
            Some(path) => match service::PidFile::write(path) {
                Ok(f) => Some(f),
                Err(e) => {
                    eprintln!("error: cannot write the PID file {}: {e}", path.display());
                    return ExitCode::FAILURE;
                }
            },
        };
        if let Some(user) = &user {
            if service::is_root() {
                match service::drop_to(user, group.as_deref()) {
                    Ok(ids) => tracing::info!(user, uid = ids.uid, gid = ids.gid, "running as {user}"),
                    Err(e) => {
                        eprintln!("error: {e}: larder does not run on as root");
                        return ExitCode::FAILURE;
                    }
                }
            } else {
                tracing::info!(user, "not started as root: [server] user left aside");
            }
        }
        if let Some(every) = service::watchdog_interval() {
            tokio::spawn(service::watchdog(every));
        }
        for ((addr, routes), scheme) in handle.addrs.iter().zip(&handle.routes).zip(&schemes) {
            for (host, prefix, what) in routes {
                tracing::info!("{scheme}://{addr}  host {host}  {prefix}  → {what}");
            }
        }
        if let Some(admin) = handle.admin_addr {
            say(format!("dashboard at http://{admin}/_larder/dashboard"));
        }
        if let (Some(admin), Some(token)) = (handle.admin_addr, &generated_token) {
            say(format!("admin API on http://{admin} with the generated token {token}"));
            say(format!("  curl -s -H 'Authorization: Bearer {token}' http://{admin}/metrics"));
        }
        for (url, token) in &push_tokens {
            say(format!("push records at {url} with the generated write token {token}"));
            say(format!(
                "  curl -X PUT -H 'Authorization: Bearer {token}' -d '{{\"price\": 42}}' {url}cars/1"
            ));
            say(format!("  curl -N '{url}?subscribe'        # live events (SSE)"));
        }
        if let Some(cert) = &self_signed {
            let port = handle.addrs[0].port();
            say(format!(
                "TLS: self-signed certificate for localhost in {}",
                cert.display()
            ));
            say(format!(
                "  curl --cacert {} https://localhost:{port}/",
                cert.display()
            ));
        }
        if let Source::Embedded = source {
            let a = handle.addrs[0];
            say("larder is running on its embedded default. Try:".into());
            say(format!("  curl -si http://{a}/data.json | head -20        # x-cache: MISS, then HIT"));
            say(format!("  curl -si -H 'Accept-Encoding: br' http://{a}/page.html -o /dev/null -D -"));
            say(format!(
                "  curl -si -H 'Accept-Encoding: zstd' http://{a}/data.json -o /dev/null -D -"
            ));
            say(format!("  curl -s --compressed http://{a}/ "));
        }
        // SIGHUP reloads the configuration file (routes, pools, listeners; certificates
        // re-read; the service manager told RELOADING, then READY), or without a file re-reads
        // the TLS certificates.
        let mut hup = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        {
            Ok(s) => Some(s),
            Err(e) => {
                tracing::warn!(error = %e, "cannot watch SIGHUP");
                None
            }
        };
        let stop = server::shutdown_signal();
        tokio::pin!(stop);
        // Bound, the operator told, the signals handled: ready (systemd's Type=notify).
        service::ready();
        loop {
            let hup_received = async {
                match hup.as_mut() {
                    Some(h) => h.recv().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = &mut stop => break,
                _ = hup_received => if handle.has_config_file() {
                    match handle.reload_from_file() {
                        Ok(restart) if restart.is_empty() => tracing::info!("SIGHUP: configuration reloaded"),
                        Ok(restart) => tracing::warn!(needs_restart = ?restart, "SIGHUP: configuration reloaded; some changes apply only at the next start"),
                        Err(e) => tracing::error!(error = %e, "SIGHUP: the configuration does not load; the running one stays"),
                    }
                } else { match handle.reload_certificates() {
                    Ok(()) => tracing::info!("SIGHUP: certificates re-read"),
                    Err(e) => tracing::error!(error = %e, "SIGHUP: cannot re-read certificates; serving the ones loaded before"),
                } },
            }
        }
        service::stopping();
        tracing::info!("shutting down; finishing in-flight requests");
        let left = handle.shutdown().await;
        if left > 0 {
            tracing::warn!(
                connections = left,
                "grace period over; closing remaining connections"
            );
        }
        ExitCode::SUCCESS
    })
}
