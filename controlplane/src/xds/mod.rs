//! The delta xDS side: snapshots of every node's resources ([`snapshot`]), the
//! protocol state of one stream ([`stream`]), the task that drives it (`task`) and the
//! gRPC service that opens and ends it ([`server`]); what a task hands the response body
//! ([`outbound`]) goes on the wire as shared pieces ([`wire`]); `reporter` keeps each
//! node's entry and the metrics; [`syncs`] gives memory back after a wave of first syncs;
//! [`per_type`] holds a stream's per-type state inline.

#[cfg(test)]
mod fixtures;
pub mod nodes;
pub mod outbound;
pub mod per_type;
mod reporter;
pub mod server;
pub mod snapshot;
pub mod stream;
pub mod syncs;
mod task;
pub mod transport;
pub mod wire;

pub use snapshot::{ResourceType, Snapshot};
