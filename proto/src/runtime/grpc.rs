//! What both binaries' gRPC servers offer besides their own services: server
//! reflection (v1 and v1alpha, so any grpcurl or grpcio client can `list` and
//! `describe`) and health. Each server advertises exactly the services it serves.

use tonic::service::Routes;

/// The gRPC health service's name.
pub const HEALTH: &str = "grpc.health.v1.Health";
/// Reflection's own service names.
pub const REFLECTION: [&str; 2] =
    ["grpc.reflection.v1.ServerReflection", "grpc.reflection.v1alpha.ServerReflection"];
/// Envoy's aggregated discovery service (delta ADS), served by the control plane.
pub const ADS: &str = "envoy.service.discovery.v3.AggregatedDiscoveryService";

/// Which of kpx's servers the reflection is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Server {
    /// `kpx-controlplane --listen`: delta ADS and `ControlPlaneAdmin`.
    ControlPlane,
    /// `kpx-dataplane --admin-listen`: `NodeAdmin`.
    NodeAgent,
}

impl Server {
    /// Every service the server answers, reflection and health included.
    pub fn services(self) -> Vec<&'static str> {
        let own: &[&'static str] = match self {
            Server::ControlPlane => &[ADS, crate::admin::control_plane_admin_server::SERVICE_NAME],
            Server::NodeAgent => &[crate::admin::node_admin_server::SERVICE_NAME],
        };
        own.iter().copied().chain([HEALTH]).chain(REFLECTION).collect()
    }
}

/// Reflection v1 and v1alpha advertising exactly what `server` serves, with the
/// descriptors of its messages.
pub fn reflection_routes(server: Server) -> Result<Routes, tonic_reflection::server::Error> {
    let sets = match server {
        Server::ControlPlane => {
            [crate::CONTROL_PLANE_FILE_DESCRIPTOR_SET, crate::XDS_FILE_DESCRIPTOR_SET].as_slice()
        }
        Server::NodeAgent => [crate::NODE_FILE_DESCRIPTOR_SET].as_slice(),
    };
    let sets = sets.iter().copied().chain([tonic_health::pb::FILE_DESCRIPTOR_SET]);
    let mut v1 = tonic_reflection::server::Builder::configure();
    let mut v1alpha = tonic_reflection::server::Builder::configure();
    for set in sets {
        v1 = v1.register_encoded_file_descriptor_set(set);
        v1alpha = v1alpha.register_encoded_file_descriptor_set(set);
    }
    for name in server.services() {
        v1 = v1.with_service_name(name);
        v1alpha = v1alpha.with_service_name(name);
    }
    Ok(Routes::new(v1.build_v1()?).add_service(v1alpha.build_v1alpha()?))
}
