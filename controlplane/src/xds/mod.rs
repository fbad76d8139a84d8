//! The delta xDS side: snapshots of every node's resources ([`snapshot`]),
//! the protocol state of one stream ([`stream`]) and the gRPC service that
//! drives it ([`server`]).

pub mod nodes;
pub mod server;
pub mod snapshot;
pub mod stream;

pub use snapshot::{ResourceType, Snapshot};
