//! Giving freed memory back to the system after large programming work. A full sync or
//! a large part of an initial sync frees hundreds of MB at once (the rendered elements,
//! the netlink batch, the diff); see [`kpx_proto::memory`].

/// Changes of at least this many Services count as large.
pub const LARGE_CHANGE_SERVICES: usize = 64;

pub use kpx_proto::memory::release_freed;
