//! kpx's own xDS resources.
//!
//! This is the only crate that knows the protobuf encoding of kpx's resources. [`pb`]
//! holds the generated messages; [`types`] holds the plain Rust values the rest of kpx
//! works with; [`convert`] turns one into the other, and validates on the way in so that
//! an invalid resource is refused with the field that is wrong.
//!
//! It also holds what both halves of kpx must agree on and that needs no I/O: the
//! resource types ([`ResourceType`]), what a Service port means on a node
//! ([`policy`]), the node as backends see it ([`node_context`]), the packet tracer
//! ([`trace`]), content versions ([`version`]), and what both binaries' command lines
//! and servers share ([`cli`], [`grpc`]).

pub mod cli;
pub mod convert;
pub mod family;
pub mod grpc;
pub mod memory;
pub mod names;
pub mod node_context;
pub mod policy;
pub mod sync;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod tls;
pub mod trace;
pub mod types;
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

/// The key of the xDS `Node.metadata` field in which a node agent started with
/// `--service-proxy-name` announces that name (a string value).
pub const SERVICE_PROXY_NAME_KEY: &str = "service_proxy_name";

/// Checks a `service.kubernetes.io/service-proxy-name` value: a label value (1 to 63 of
/// `a-z A-Z 0-9 . _ -`, alphanumeric at both ends).
pub fn check_service_proxy_name(text: &str) -> Result<(), String> {
    let alnum_ends = text.starts_with(|c: char| c.is_ascii_alphanumeric())
        && text.ends_with(|c: char| c.is_ascii_alphanumeric());
    let chars = text.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if text.len() <= 63 && alnum_ends && chars {
        Ok(())
    } else {
        Err(format!(
            "{text:?} is not a label value (1 to 63 of a-z A-Z 0-9 . _ -, alphanumeric at both ends)"
        ))
    }
}

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
