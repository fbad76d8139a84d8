//! In-memory stand-ins for every kernel facility of [`crate::exec`], in the manner of
//! knftables' fake: each applies a request to a model with the kernel's checks (whole or
//! nothing where the kernel is atomic) and shows its state as the tool would print it.
//! A handle is cheap to clone and every clone sees the same model, so a test keeps one
//! while the code under test owns another. `fail_next` makes the next request fail.

mod conntrack;
mod ipset;
mod iptables;
mod ipvs;
mod links;
mod nft;

pub use conntrack::{FakeConntrack, FakeSysctl};
pub use ipset::FakeIpset;
pub use iptables::FakeIptables;
pub use ipvs::FakeIpvs;
pub use links::FakeLinks;
pub use nft::FakeNft;

/// One fake node: every facility.
#[derive(Clone, Default)]
pub struct FakeKernel {
    pub nft: FakeNft,
    pub iptables: FakeIptables,
    pub ipset: FakeIpset,
    pub links: FakeLinks,
    pub ipvs: FakeIpvs,
    pub conntrack: FakeConntrack,
    pub sysctl: FakeSysctl,
}

impl FakeKernel {
    pub fn new() -> Self {
        Self::default()
    }
}
