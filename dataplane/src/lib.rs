//! kpx node agent: delta xDS client → validated state → sled → kernel backend.
//!
//! Knows nothing about Kubernetes: it only ever sees kpx's own resources.

pub mod admin;
pub mod agent;
pub mod backend;
pub mod config;
pub mod conntrack;
pub mod healthcheck;
pub mod http;
pub mod metrics;
pub mod serve;
pub mod state;
pub mod status;
pub mod store;
pub mod xds_client;
