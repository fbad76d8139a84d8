//! `kpx-controlplane`: wiring only. Configuration is parsed here; the work
//! happens in the library.

use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use clap::Parser;
use kpx_controlplane::config::{Config, Flags, Security};
use kpx_controlplane::serve::{self, Listeners};
use kpx_controlplane::source::{self, Prepared};
use kpx_proto::tls::ReloadingServerConfig;

/// jemalloc (see `kpx_controlplane::memory`), with its options.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc reads its options from this symbol when it starts.
#[export_name = "_rjem_malloc_conf"]
#[used]
static JEMALLOC_OPTIONS: &[u8; 60] = kpx_controlplane::memory::JEMALLOC_OPTIONS;

fn main() -> ExitCode {
    let flags = match Flags::try_parse() {
        Ok(a) => a,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() { ExitCode::from(2) } else { ExitCode::SUCCESS };
        }
    };
    // kube-rs logs every failed request at ERROR, each retry of a watch again; the source
    // says when a watch fails and when it works again (source::kubernetes).
    kpx_proto::cli::init_logs(flags.log_format, &["kube_client::client::builder=off"]);
    let config = match Config::resolve(flags) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("kpx-controlplane: {e}");
            return ExitCode::from(2);
        }
    };
    let tls = match &config.security {
        Security::Tls(files) => match ReloadingServerConfig::load(files.clone()) {
            Ok(tls) => Some(Arc::new(tls)),
            Err(e) => {
                eprintln!("kpx-controlplane: --tls-cert/--tls-key/--tls-client-ca: {e}");
                return ExitCode::from(2);
            }
        },
        Security::Plaintext => None,
    };
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("kpx-controlplane: cannot start the runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let mut prepared = Vec::new();
    for spec in &config.sources {
        match runtime.block_on(source::prepare(spec)) {
            Ok(p) => prepared.push(p),
            Err(e) => {
                eprintln!("kpx-controlplane: {}", kpx_proto::cli::causes(&e));
                return ExitCode::from(2);
            }
        }
    }
    match runtime.block_on(bind_and_run(config, tls, prepared)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            ExitCode::from(1)
        }
    }
}

/// Binds `--listen` and `--metrics-listen`, then runs until a shutdown signal.
async fn bind_and_run(
    config: Config,
    tls: Option<Arc<ReloadingServerConfig>>,
    prepared: Vec<Prepared>,
) -> anyhow::Result<()> {
    let grpc = tokio::net::TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("cannot listen on {}", config.listen))?;
    let metrics = tokio::net::TcpListener::bind(config.metrics_listen)
        .await
        .with_context(|| format!("cannot listen on {} (--metrics-listen)", config.metrics_listen))?;
    serve::run(config, tls, prepared, Listeners { grpc, metrics }, shutdown()).await
}

async fn shutdown() {
    kpx_proto::cli::shutdown_signal().await;
    tracing::info!("shutting down");
}
