//! The delta xDS side: snapshots of every node's resources ([`snapshot`]),
//! the protocol state of one stream ([`stream`]) and the gRPC service that
//! drives it ([`server`]); responses go on the wire as shared pieces ([`wire`]);
//! [`syncs`] gives memory back after a wave of first syncs; [`per_type`] holds a stream's
//! per-type state inline.

pub mod nodes;
pub mod per_type;
pub mod server;
pub mod snapshot;
pub mod stream;
pub mod syncs;
pub mod transport;
pub mod wire;

pub use snapshot::{ResourceType, Snapshot};
