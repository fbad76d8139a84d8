//! The behaviour suite (see `kpx_e2e::scenarios::behaviour`) with `--backend iptables`, in both
//! flavours. Run as root (network namespaces); binaries built first (see README).

mod nft {
    kpx_e2e::behaviour_suite!(kpx_e2e::harness::topology::ProxyBackend::Iptables);
}

mod legacy {
    kpx_e2e::behaviour_suite!(kpx_e2e::harness::topology::ProxyBackend::IptablesLegacy);
}
