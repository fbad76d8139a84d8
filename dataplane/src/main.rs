//! `kpx-dataplane`: wiring only. Flags and the `--config` file become an
//! [`AgentConfig`]; this builds the backend over the kernel, the store and the agent from
//! it, and starts the servers and the xDS client.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use kpx_dataplane::agent::{Agent, Facilities, SharedAgent};
use kpx_dataplane::backend::iptables::IptablesBackend;
use kpx_dataplane::backend::ipvs::{IpvsBackend, IpvsKernel};
use kpx_dataplane::backend::kube_proxy::{self, KubeProxyKernel};
use kpx_dataplane::backend::nftables::NftablesBackend;
use kpx_dataplane::backend::Backend;
use kpx_dataplane::config::{AgentConfig, BackendConfig, Flags, IptablesMode, Mode, RunConfig};
use kpx_dataplane::exec::conntrack::{ConntrackProcess, SharedConntrack};
use kpx_dataplane::exec::ipset::tool::IpsetProcess;
use kpx_dataplane::exec::iptables::{Flavour, Iptables, IptablesProcess};
use kpx_dataplane::exec::ipvs::netlink::NetlinkIpvs;
use kpx_dataplane::exec::links::IpProcess;
use kpx_dataplane::exec::nft;
use kpx_dataplane::exec::sysctl::ProcSys;
use kpx_dataplane::node_sysctls::{self, Keeper};
use kpx_dataplane::store::{Removal, Store};
use kpx_dataplane::{home, outage, serve, upkeep, xds_client};
use kpx_proto::node_context::ProxySettings;

fn main() -> ExitCode {
    kpx_proto::memory::keep_large_buffers_apart();
    let flags = match Flags::try_parse() {
        Ok(f) => f,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() { ExitCode::from(2) } else { ExitCode::SUCCESS };
        }
    };
    kpx_proto::cli::init_logs(flags.log_format, &[]);
    let config = match AgentConfig::resolve(flags) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("kpx-dataplane: {e}");
            return ExitCode::from(2);
        }
    };
    if let Mode::Run(run) = &config.mode {
        if let Err(e) = std::fs::create_dir_all(&run.state_dir) {
            eprintln!("kpx-dataplane: --state-dir {}: {e}", run.state_dir.display());
            return ExitCode::from(2);
        }
    }
    let proc_sys = || ProcSys::with_net(&config.proc_sys_net);
    let settings = node_sysctls::wanted(&config, node_sysctls::node_cpus());
    let mut keeper = Keeper::new(Box::new(proc_sys()), settings);
    let conntrack: SharedConntrack = Arc::new(ConntrackProcess);
    // --init-only touches no rules: no backend.
    let backend = || backend(&config.backend, &conntrack);
    let result = match config.mode {
        Mode::Cleanup { own, kube_proxy, state_dir } => {
            cleanup(backend().as_mut(), own.then_some(state_dir.as_path()), kube_proxy)
        }
        Mode::Probe { kind, healthz, pod_uid } => {
            return match kpx_dataplane::probe::probe(kind, healthz, pod_uid.as_deref()) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("kpx-dataplane --probe: {e}");
                    ExitCode::from(1)
                }
            };
        }
        Mode::InitOnly => make_settings(&mut keeper).map(|()| {
            tracing::info!("the node's kernel settings are made; --init-only ends here");
        }),
        Mode::Run(run_config) => make_settings(&mut keeper)
            .and_then(|()| run(*run_config, config.proxy, backend(), Arc::clone(&conntrack), keeper)),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            ExitCode::from(1)
        }
    }
}

fn flavour(mode: IptablesMode) -> Flavour {
    let flavour = match mode {
        IptablesMode::Auto => Flavour::detect(),
        IptablesMode::Nft => Flavour::Nft,
        IptablesMode::Legacy => Flavour::Legacy,
    };
    tracing::info!(?flavour, "iptables flavour");
    flavour
}

/// The configured backend over the kernel's own facilities.
fn backend(config: &BackendConfig, conntrack: &SharedConntrack) -> Box<dyn Backend> {
    match config {
        BackendConfig::Nftables => Box::new(NftablesBackend::new(nft::open::system())),
        BackendConfig::Iptables { mode, localhost_nodeports } => {
            let backend = IptablesBackend::new(Box::new(IptablesProcess { flavour: flavour(*mode) }));
            if *localhost_nodeports {
                Box::new(backend.with_localhost_nodeports())
            } else {
                Box::new(backend)
            }
        }
        BackendConfig::Ipvs { mode, options } => {
            let kernel = IpvsKernel::system(flavour(*mode), Arc::clone(conntrack));
            Box::new(IpvsBackend::new(options.clone(), kernel))
        }
    }
}

/// Makes the kernel settings the configuration asks for (only those that differ are written).
fn make_settings(keeper: &mut Keeper) -> anyhow::Result<()> {
    let applied = keeper.make()?;
    for done in applied.iter().filter(|a| a.after.is_none()) {
        tracing::debug!(sysctl = done.name, value = %done.before, "kernel setting already made");
    }
    if applied.iter().any(|a| a.name == node_sysctls::ROUTE_LOCALNET) {
        tracing::info!("NodePorts also on 127.0.0.1 ({} = 1)", node_sysctls::ROUTE_LOCALNET);
    }
    Ok(())
}

/// Removes kube-proxy's leftovers (`kube_proxy`), and kpx's rules and the state stored in
/// `own` (its state directory).
fn cleanup(backend: &mut dyn Backend, own: Option<&std::path::Path>, kube_proxy: bool) -> anyhow::Result<()> {
    if kube_proxy {
        let mut kernel = KubeProxyKernel {
            nft: nft::open::system(),
            iptables: [Flavour::Nft, Flavour::Legacy]
                .into_iter()
                .map(|flavour| (flavour, Box::new(IptablesProcess { flavour }) as Box<dyn Iptables>))
                .collect(),
            ipset: Box::new(IpsetProcess),
            links: Box::new(IpProcess),
            ipvs: Box::new(NetlinkIpvs::default()),
        };
        let removed =
            kube_proxy::remove_leftovers(&mut kernel).context("removing kube-proxy's rules failed")?;
        tracing::info!(
            nft_tables = ?removed.nft_tables,
            iptables_chains = removed.chains.len(),
            ipvs_services = removed.ipvs_services,
            ipsets = removed.ipsets.len(),
            interface = removed.interface,
            "removed what kube-proxy left behind"
        );
    }
    if let Some(state_dir) = own {
        backend.cleanup().context("cleanup failed")?;
        tracing::info!(backend = backend.name(), "removed everything kpx programmed");
        // The next agent there is a new install: it must not program this one's state.
        match Store::remove(state_dir).context("removing the stored state failed")? {
            Removal::Removed => tracing::info!(state_dir = %state_dir.display(), "removed the stored state"),
            Removal::InUse => tracing::warn!(
                state_dir = %state_dir.display(),
                "the stored state is kept: a running agent holds it (stop it first to remove it)"
            ),
            Removal::Absent => {}
        }
    }
    Ok(())
}

fn run(
    config: RunConfig,
    settings: ProxySettings,
    backend: Box<dyn Backend>,
    conntrack: SharedConntrack,
    keeper: Keeper,
) -> anyhow::Result<()> {
    let store = Store::open(&config.state_dir)?;
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let api = config.api.clone();
    let services =
        config.control_planes.iter().filter_map(|c| home::service_of_url(&c.url)).collect::<Vec<_>>();
    let current_install = |state: &kpx_dataplane::state::NodeState| {
        runtime.block_on(home::current_install(&api, state, &services))
    };
    let facilities =
        Facilities { backend, conntrack, interfaces: Box::new(kpx_dataplane::exec::interfaces::Rtnetlink) };
    let agent = Agent::start_checking_install(
        config.node_name,
        settings,
        facilities,
        store,
        config.control_planes.iter().map(|c| c.url.as_str()).collect::<Vec<_>>().join(","),
        current_install,
    )?;
    let agent = SharedAgent::new(agent);
    let unreachable_after =
        config.control_planes.first().map_or(Duration::from_secs(30), |c| c.keepalive * 3);
    runtime.block_on(async {
        serve::start(&agent, config.listen, config.pod_uid).await?;
        tokio::select! {
            _ = xds_client::run(config.control_planes, config.api.clone(), agent.clone(), config.sync.min) => {},
            _ = outage::report(agent.clone(), config.api, unreachable_after) => {},
            _ = upkeep::run(agent, config.sync.full, keeper) => {},
            _ = kpx_proto::cli::shutdown_signal() => {
                tracing::info!("shutting down; rules stay in place (use --cleanup to remove them)");
            },
        }
        anyhow::Ok(())
    })
}
