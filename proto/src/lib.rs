//! kpx's own xDS resources.
//!
//! This is the only crate that knows protobuf. [`pb`] holds the generated
//! messages; [`types`] holds the plain Rust values the rest of kpx works with;
//! [`convert`] turns one into the other, and validates on the way in so that an
//! invalid resource is refused with the field that is wrong.

pub mod convert;
pub mod types;
pub mod version;

/// Generated protobuf messages of `kpx/v1/kpx.proto`.
pub mod pb {
    #![allow(clippy::all)]
    include!(concat!(env!("OUT_DIR"), "/kpx.v1.rs"));
}

/// Encoded `FileDescriptorSet` of kpx's messages (for gRPC reflection).
pub const FILE_DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/kpx_descriptor.bin"));

/// Type URL of [`types::ServiceView`] resources.
pub const SERVICE_VIEW_TYPE_URL: &str = "type.googleapis.com/kpx.v1.ServiceView";
/// Type URL of [`types::NodeConfig`] resources.
pub const NODE_CONFIG_TYPE_URL: &str = "type.googleapis.com/kpx.v1.NodeConfig";

pub use convert::InvalidResource;
