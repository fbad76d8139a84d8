//! What both halves of kpx share, in three jobs:
//! - [`wire`]: kpx's xDS resources on the wire — the generated protobuf messages
//!   ([`pb`]), the resource types ([`ResourceType`]), the conversion to and from plain
//!   values that validates on the way in, naming the field that is wrong ([`convert`]),
//!   and content versions ([`version`]). The only code that knows the encoding.
//! - [`model`]: the plain values the rest of kpx works with ([`types`]), what a Service
//!   port means on a node ([`policy`]), the node as backends see it ([`node_context`]),
//!   the packet tracer ([`trace`]); no I/O.
//! - [`runtime`]: what both binaries' processes share — command line and logs ([`cli`]),
//!   TLS ([`tls`]), reflection and health ([`grpc`]), the allocator ([`memory`]), the lock
//!   helper ([`sync`]).
//!
//! Each module is re-exported at the root, so `kpx_proto::types` is
//! `kpx_proto::model::types`.

pub mod model;
pub mod runtime;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod wire;

// The paths call sites use: each module under its job, re-exported at the root.
pub use model::{
    check_service_proxy_name, family, names, node_context, policy, trace, types, SERVICE_PROXY_NAME_KEY,
};
pub use runtime::{cli, grpc, memory, sync, tls};
pub use wire::{
    admin, convert, pb, version, InvalidResource, ResourceType, CONTROL_PLANE_FILE_DESCRIPTOR_SET,
    NODE_CONFIG_TYPE_URL, NODE_FILE_DESCRIPTOR_SET, SERVICE_VIEW_TYPE_URL, XDS_FILE_DESCRIPTOR_SET,
};
