//! kpx node agent: delta xDS client → validated state → kernel backend → sled → ACK.
//!
//! Knows nothing about Kubernetes: it only ever sees kpx's own resources. [`config`]
//! turns flags and the `--config` file into typed values once; [`exec`] is the only code
//! that touches the kernel, behind traits with in-memory fakes for tests.

pub mod admin;
pub mod agent;
pub mod apiserver;
pub mod backend;
pub mod config;
pub mod connection;
pub mod conntrack;
pub mod exec;
pub mod healthcheck;
pub mod home;
pub mod http;
pub mod memory;
pub mod metrics;
pub mod node_sysctls;
pub mod outage;
pub mod probe;
pub mod serve;
pub mod state;
pub mod status;
pub mod store;
pub mod upkeep;
pub mod xds_client;
