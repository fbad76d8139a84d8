//! What both binaries' gRPC servers offer besides their own services: server
//! reflection (v1 and v1alpha, so any grpcurl or grpcio client can `list` and
//! `describe`) over kpx's descriptors, Envoy's ADS where it is served, and health.

use tonic::service::Routes;

/// Reflection v1 and v1alpha for kpx's own services and messages, gRPC health, and
/// (with `with_ads`) Envoy's delta ADS.
pub fn reflection_routes(with_ads: bool) -> Result<Routes, tonic_reflection::server::Error> {
    let mut sets = vec![crate::FILE_DESCRIPTOR_SET, tonic_health::pb::FILE_DESCRIPTOR_SET];
    if with_ads {
        sets.push(crate::XDS_FILE_DESCRIPTOR_SET);
    }
    let mut v1 = tonic_reflection::server::Builder::configure();
    let mut v1alpha = tonic_reflection::server::Builder::configure();
    for set in sets {
        v1 = v1.register_encoded_file_descriptor_set(set);
        v1alpha = v1alpha.register_encoded_file_descriptor_set(set);
    }
    Ok(Routes::new(v1.build_v1()?).add_service(v1alpha.build_v1alpha()?))
}
