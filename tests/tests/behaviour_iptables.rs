//! The behaviour suite (see `kpx_e2e::scenarios`) with `--backend iptables`, in both
//! flavours. Run as root (network namespaces); binaries built first (see README).

mod nft {
    kpx_e2e::behaviour_suite!(kpx_e2e::topology::ProxyBackend::Iptables);
}

mod legacy {
    kpx_e2e::behaviour_suite!(kpx_e2e::topology::ProxyBackend::IptablesLegacy);
}
