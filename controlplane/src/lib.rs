//! kpx control plane: sources → cluster model → per-node views → delta xDS.

pub mod admin;
pub mod config;
pub mod mcs;
pub mod memory;
pub mod metrics;
pub mod model;
pub mod probes;
pub mod publisher;
pub mod serve;
pub mod source;
pub mod trust;
pub mod view;
pub mod xds;
