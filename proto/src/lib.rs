//! kpx's own xDS resources.
//!
//! This is the only crate that knows protobuf. [`pb`] holds the generated
//! messages; [`types`] holds the plain Rust values the rest of kpx works with;
//! [`convert`] turns one into the other, and validates on the way in so that an
//! invalid resource is refused with the field that is wrong.

pub mod categorize;
pub mod convert;
pub mod family;
pub mod grpc;
pub mod trace;
pub mod types;
pub mod version;

/// Generated protobuf messages of `kpx/v1/kpx.proto` (re-exported here) and the admin
/// services of `kpx/admin/v1/admin.proto` (in [`admin`]).
pub mod pb {
    #![allow(clippy::all)]
    pub mod kpx {
        pub mod v1 {
            include!(concat!(env!("OUT_DIR"), "/kpx.v1.rs"));
        }
        pub mod admin {
            pub mod v1 {
                include!(concat!(env!("OUT_DIR"), "/kpx.admin.v1.rs"));
            }
        }
    }
    pub use kpx::v1::*;
}

/// The admin APIs: `ControlPlaneAdmin` and `NodeAdmin`, servers and clients.
pub mod admin {
    pub use crate::pb::kpx::admin::v1::*;
}

/// Encoded `FileDescriptorSet` of kpx's messages and admin services (for gRPC reflection).
pub const FILE_DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/kpx_descriptor.bin"));

/// Encoded `FileDescriptorSet` of Envoy's ADS service and its imports (for gRPC reflection).
pub const XDS_FILE_DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/xds_descriptor.bin"));

/// Type URL of [`types::ServiceView`] resources.
pub const SERVICE_VIEW_TYPE_URL: &str = "type.googleapis.com/kpx.v1.ServiceView";
/// Type URL of [`types::NodeConfig`] resources.
pub const NODE_CONFIG_TYPE_URL: &str = "type.googleapis.com/kpx.v1.NodeConfig";

pub use convert::InvalidResource;
