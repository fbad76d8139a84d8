//! Full sync and one-endpoint-change times of the node agent's backends, side by side.
//!
//! `sudo ./tests/bench-backends.sh [SERVICES…] [BACKEND…]` (default 1000 10000, every
//! backend; name backends by the start of their label, e.g. `ipvs nftables`): for each backend
//! (nftables, iptables-legacy, iptables-nft, and IPVS where the kernel has it: run
//! `sudo tests/vm/run-in-vm.sh target/release/bench_backends` for a kernel with IPVS) and each size, Services of one port with
//! 10 endpoints each are programmed from scratch into a scratch network namespace
//! (full sync), then one endpoint of one Service is replaced 20 times (one partial
//! apply each, the work the agent does per delta). Prints figures; asserts nothing.

use std::time::{Duration, Instant};

use kpx_dataplane::backend::iptables::IptablesBackend;
use kpx_dataplane::backend::ipvs::{IpvsBackend, IpvsKernel, IpvsOptions};
use kpx_dataplane::backend::nftables::NftablesBackend;
use kpx_dataplane::backend::{Backend, NodeContext};
use kpx_dataplane::exec::conntrack::ConntrackProcess;
use kpx_dataplane::exec::iptables::{Flavour, IptablesProcess};
use kpx_dataplane::exec::ipvs::open_socket;
use kpx_dataplane::exec::nft::{self, NftProcess};
use kpx_dataplane::state::{ChangeSet, NodeState, Versioned};
use kpx_e2e::netns::Netns;
use kpx_proto::types::{Endpoint, NodeConfig, Protocol, ServicePort, ServiceView};

const ENDPOINTS: usize = 10;
const CHANGES: usize = 20;

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
        s.services.insert(v.value.resource_name(), Versioned { version: v.version, value: v.value.into() });
    }
    s
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// The backends named on the command line (by the start of their label), or all.
fn wanted(label: &str) -> bool {
    let names: Vec<String> = std::env::args().skip(1).filter(|a| a.parse::<usize>().is_err()).collect();
    names.is_empty() || names.iter().any(|n| label.starts_with(n.as_str()))
}

fn measure(label: &str, backend: &mut dyn Backend, services: usize) {
    if !wanted(label) {
        return;
    }
    let mut desired = state(services);
    let context = NodeContext::default();
    let started = Instant::now();
    if let Err(e) = backend.full_sync(&desired, &context) {
        println!("{label:<18} {services:>6}  full sync failed: {e}");
        return;
    }
    let full = started.elapsed();
    let mut changes = Vec::new();
    for g in 1..=CHANGES {
        let i = (g * 7919) % services;
        let mut v = service(i, 0);
        v.value.ports[0].endpoints[g % ENDPOINTS].address = address([10, 250], g);
        v.version = format!("{i}-changed-{g}");
        let name = v.value.resource_name();
        desired.services.insert(name.clone(), Versioned { version: v.version, value: v.value.into() });
        let started = Instant::now();
        if let Err(e) = backend.apply(&desired, &context, &ChangeSet { services: [name].into(), node: false })
        {
            println!("{label:<16} {services:>6}  apply failed: {e}");
            return;
        }
        changes.push(started.elapsed());
    }
    changes.sort();
    println!(
        "{label:<18} {services:>6}  full sync {:>9.1} ms   one endpoint change p50 {:>8.2} ms  p99 {:>8.2} ms",
        full.as_secs_f64() * 1e3,
        percentile(&changes, 0.5).as_secs_f64() * 1e3,
        percentile(&changes, 0.99).as_secs_f64() * 1e3,
    );
    if let Err(e) = backend.cleanup() {
        println!("{label:<16} cleanup failed: {e}");
    }
}

fn main() {
    let sizes: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let sizes = if sizes.is_empty() { vec![1000, 10000] } else { sizes };
    let ns = Netns::new("bench");
    let sizes_in = sizes.clone();
    ns.run_in(move || {
        println!("backend          services  ({ENDPOINTS} endpoints each; {CHANGES} changes)");
        for services in sizes_in {
            match nft::library() {
                Ok(library) => measure("nftables (lib)", &mut NftablesBackend::new(library), services),
                Err(e) => println!("nftables (lib): {e}"),
            }
            measure("nftables (nft -f)", &mut NftablesBackend::new(Box::new(NftProcess::new())), services);
            for (label, flavour) in [("iptables-legacy", Flavour::Legacy), ("iptables-nft", Flavour::Nft)] {
                measure(label, &mut IptablesBackend::new(Box::new(IptablesProcess { flavour })), services);
            }
            match open_socket() {
                Ok(_) => {
                    let options = IpvsOptions {
                        scheduler: "rr".into(),
                        drain_grace: Duration::from_secs(900),
                        strict_arp: false,
                    };
                    let kernel = IpvsKernel::system(Flavour::detect(), std::sync::Arc::new(ConntrackProcess));
                    measure("ipvs", &mut IpvsBackend::new(options, kernel), services)
                }
                Err(e) => println!("ipvs: {e}"),
            }
        }
    });
}
