//! Full sync and one-endpoint-change times of the node agent's backends, side by side.
//!
//! `sudo ./tests/bench-backends.sh [--changes N] [SERVICES…] [BACKEND…]` (default 1000 10000,
//! every backend, 20 changes; name backends by the start of their label, e.g. `ipvs
//! nftables`): for each backend
//! (nftables, iptables-legacy, iptables-nft, and IPVS where the kernel has it: run
//! `sudo tests/vm/run-in-vm.sh target/release/bench_backends` for a kernel with IPVS) and each size, Services of one port with
//! 10 endpoints each are programmed from scratch into a scratch network namespace
//! (full sync), then one endpoint of one Service is replaced N times (one partial
//! apply each, the work the agent does per delta), then a new backend (an agent
//! restarted over its store) makes a full sync over the rules the first one left: what a
//! restart costs. Prints figures; asserts nothing.

use std::time::{Duration, Instant};

use kpx_dataplane::backend::iptables::IptablesBackend;
use kpx_dataplane::backend::ipvs::{IpvsBackend, IpvsKernel, IpvsOptions};
use kpx_dataplane::backend::nftables::NftablesBackend;
use kpx_dataplane::backend::{Backend, NodeContext};
use kpx_dataplane::exec::conntrack::ConntrackProcess;
use kpx_dataplane::exec::iptables::{Flavour, IptablesProcess};
use kpx_dataplane::exec::ipvs::netlink::open_socket;
use kpx_dataplane::exec::nft::open::{self, NftProcess};
use kpx_dataplane::state::{ChangeSet, NodeState, Versioned};
use kpx_e2e::harness::netns::Netns;
use kpx_e2e::harness::percentile;
use kpx_proto::types::{Endpoint, NodeConfig, Protocol, ServicePort, ServiceView};

const ENDPOINTS: usize = 10;

/// The command line: sizes, backend names, and how many changes to time.
struct Args {
    sizes: Vec<usize>,
    names: Vec<String>,
    changes: usize,
}

fn args() -> Result<Args, String> {
    let mut a = Args { sizes: vec![], names: vec![], changes: 20 };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        if arg == "--changes" {
            let value = it.next().ok_or("--changes needs a number")?;
            a.changes =
                value.parse().ok().filter(|&n| n > 0).ok_or(format!("--changes {value}: not a count"))?;
        } else if let Ok(size) = arg.parse() {
            a.sizes.push(size);
        } else {
            a.names.push(arg);
        }
    }
    if a.sizes.is_empty() {
        a.sizes = vec![1000, 10000];
    }
    Ok(a)
}

fn address(base: [u8; 2], n: usize) -> std::net::IpAddr {
    std::net::Ipv4Addr::new(base[0], base[1], (n / 250) as u8, (n % 250 + 1) as u8).into()
}

fn service(i: usize, generation: usize) -> Versioned<ServiceView> {
    let endpoints = (0..ENDPOINTS)
        .map(|e| {
            let n = (i * ENDPOINTS + e + generation * 7) % 60000;
            Endpoint::new(address([10, 200 + (n / 62500) as u8], n % 62500), 8080, "n", "", false)
        })
        .collect();
    let vip =
        std::net::Ipv4Addr::new(10, 96 + (i / 62500) as u8, ((i % 62500) / 250) as u8, (i % 250 + 1) as u8);
    let view = ServiceView::new(
        "bench",
        "ns",
        &format!("svc-{i}"),
        vec![vip.into()],
        vec![ServicePort::new("http", Protocol::Tcp, 80, endpoints)],
    );
    Versioned { version: format!("{i}-{generation}"), value: view }
}

fn state(services: usize) -> NodeState {
    let node = NodeConfig {
        name: "n".into(),
        addresses: vec!["10.0.0.1".parse().expect("ip")],
        ..Default::default()
    };
    let mut s =
        NodeState { node: Some(Versioned { version: "1".into(), value: node }), ..Default::default() };
    for i in 0..services {
        let v = service(i, 0);
        s.services_mut()
            .insert(v.value.resource_name(), Versioned { version: v.version, value: v.value.into() });
    }
    s
}

/// The backends named on the command line (by the start of their label), or all.
fn wanted(names: &[String], label: &str) -> bool {
    names.is_empty() || names.iter().any(|n| label.starts_with(n.as_str()))
}

/// Makes a backend over the namespace's kernel (each call a new one, as a restarted agent).
type Make<'a> = &'a dyn Fn() -> Result<Box<dyn Backend>, String>;

fn measure(a: &Args, label: &str, make: Make<'_>, services: usize) {
    if !wanted(&a.names, label) {
        return;
    }
    let mut backend = match make() {
        Ok(b) => b,
        Err(e) => return println!("{label}: {e}"),
    };
    let mut desired = state(services);
    let context = NodeContext::default();
    let started = Instant::now();
    if let Err(e) = backend.full_sync(&desired, &context) {
        println!("{label:<18} {services:>6}  full sync failed: {e}");
        return;
    }
    let full = started.elapsed();
    let mut changes = Vec::new();
    for g in 1..=a.changes {
        let i = (g * 7919) % services;
        let mut v = service(i, 0);
        v.value.ports[0].endpoints[g % ENDPOINTS].address = address([10, 250], g);
        v.version = format!("{i}-changed-{g}");
        let name = v.value.resource_name();
        desired.services_mut().insert(name.clone(), Versioned { version: v.version, value: v.value.into() });
        let started = Instant::now();
        if let Err(e) = backend.apply(&desired, &context, &ChangeSet { services: [name].into(), node: false })
        {
            println!("{label:<16} {services:>6}  apply failed: {e}");
            return;
        }
        changes.push(started.elapsed());
    }
    changes.sort();
    drop(backend);
    let Ok(mut restarted) = make() else { return println!("{label}: no second backend") };
    let started = Instant::now();
    let restart = restarted.full_sync(&desired, &context).map(|()| started.elapsed());
    println!(
        "{label:<18} {services:>6}  full sync {:>9.1} ms   one endpoint change p50 {:>8.2} ms  p99 {:>8.2} ms   restart over its rules {}",
        full.as_secs_f64() * 1e3,
        percentile(&changes, 0.5).as_secs_f64() * 1e3,
        percentile(&changes, 0.99).as_secs_f64() * 1e3,
        match restart {
            Ok(took) => format!("{:>9.1} ms", took.as_secs_f64() * 1e3),
            Err(e) => format!("failed: {e}"),
        }
    );
    if let Err(e) = restarted.cleanup() {
        println!("{label:<16} cleanup failed: {e}");
    }
}

fn main() -> std::process::ExitCode {
    let a = match args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("bench_backends: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    let ns = Netns::new("bench");
    ns.run_in(move || {
        println!("backend          services  ({ENDPOINTS} endpoints each; {} changes)", a.changes);
        for &services in &a.sizes {
            measure(
                &a,
                "nftables (lib)",
                &|| Ok(Box::new(NftablesBackend::new(open::library().map_err(|e| e.to_string())?))),
                services,
            );
            measure(
                &a,
                "nftables (nft -f)",
                &|| Ok(Box::new(NftablesBackend::new(Box::new(NftProcess::new())))),
                services,
            );
            for (label, flavour) in [("iptables-legacy", Flavour::Legacy), ("iptables-nft", Flavour::Nft)] {
                measure(
                    &a,
                    label,
                    &|| Ok(Box::new(IptablesBackend::new(Box::new(IptablesProcess { flavour })))),
                    services,
                );
            }
            match open_socket() {
                Ok(_) => {
                    let make = || -> Result<Box<dyn Backend>, String> {
                        let options = IpvsOptions {
                            scheduler: "rr".into(),
                            drain_grace: Duration::from_secs(900),
                            strict_arp: false,
                        };
                        let conntrack = std::sync::Arc::new(ConntrackProcess);
                        Ok(Box::new(IpvsBackend::new(
                            options,
                            IpvsKernel::system(Flavour::detect(), conntrack),
                        )))
                    };
                    measure(&a, "ipvs", &make, services)
                }
                Err(e) => println!("ipvs: {e}"),
            }
        }
    });
    std::process::ExitCode::SUCCESS
}
