//! Faults under continuous traffic over real processes (`kpx_e2e::fault_scenarios`),
//! on nftables and iptables-nft here; the IPVS suite runs them in its VM.

macro_rules! on_backends {
    ($($name:ident),*) => {
        mod nftables {
            $(#[test] fn $name() { kpx_e2e::fault_scenarios::$name(kpx_e2e::topology::ProxyBackend::Nftables); })*
        }
        mod iptables {
            $(#[test] fn $name() { kpx_e2e::fault_scenarios::$name(kpx_e2e::topology::ProxyBackend::Iptables); })*
        }
    };
}

on_backends!(
    control_plane_crash_and_a_change_while_it_is_down,
    a_second_replica_takes_over,
    a_cut_link_is_noticed_by_keepalive_and_the_stream_resumes,
    a_stalled_control_plane_is_noticed_and_another_replica_followed,
    the_agent_killed_during_a_10k_service_apply,
    a_full_state_filesystem_nacks_and_recovers
);
