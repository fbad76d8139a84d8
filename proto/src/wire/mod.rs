//! kpx's resources on the wire: the generated protobuf messages ([`pb`], the admin
//! services in [`admin`]), their descriptors for reflection, the resource types and their
//! type URLs, the conversion to and from the plain values of [`crate::model`] with
//! validation ([`convert`]), and content versions ([`version`]).

pub mod convert;
pub mod version;

/// Generated protobuf messages of `kpx/v1/kpx.proto` (re-exported here) and the admin
/// services of `kpx/admin/v1/` (in [`admin`]).
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

/// Encoded `FileDescriptorSet` of the control plane's admin service and its messages (for gRPC reflection).
pub const CONTROL_PLANE_FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/control_plane_descriptor.bin"));

/// Encoded `FileDescriptorSet` of the node agent's admin service and its messages (for gRPC reflection).
pub const NODE_FILE_DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/node_descriptor.bin"));

/// Encoded `FileDescriptorSet` of Envoy's ADS service and its imports (for gRPC reflection).
pub const XDS_FILE_DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/xds_descriptor.bin"));

/// Type URL of [`types::ServiceView`] resources.
pub const SERVICE_VIEW_TYPE_URL: &str = "type.googleapis.com/kpx.v1.ServiceView";
/// Type URL of [`types::NodeConfig`] resources.
pub const NODE_CONFIG_TYPE_URL: &str = "type.googleapis.com/kpx.v1.NodeConfig";

/// kpx's resource types, as both the control plane and the node agent name them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ResourceType {
    /// First: a node subscribes to its config first and a stream serves it first, so a
    /// node usually programs its Services knowing its pod CIDRs and addresses.
    NodeConfig,
    ServiceView,
}

impl ResourceType {
    /// Every type, in the order of subscription and service.
    pub const ALL: [ResourceType; 2] = [ResourceType::NodeConfig, ResourceType::ServiceView];

    pub fn type_url(self) -> &'static str {
        match self {
            ResourceType::ServiceView => SERVICE_VIEW_TYPE_URL,
            ResourceType::NodeConfig => NODE_CONFIG_TYPE_URL,
        }
    }

    pub fn from_type_url(url: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.type_url() == url)
    }
}

pub use convert::InvalidResource;
