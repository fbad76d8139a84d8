//! The behaviour suite (see `kpx_e2e::scenarios::behaviour`) with `--backend nftables`.
//! Run as root (network namespaces); binaries built first (see README).

kpx_e2e::behaviour_suite!(kpx_e2e::harness::topology::ProxyBackend::Nftables);
