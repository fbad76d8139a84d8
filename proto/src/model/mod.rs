//! The model both halves share, free of I/O and of the wire: the plain values the rest of
//! kpx works with ([`types`]), their names ([`names`]), address families ([`family`]),
//! what a Service port means on a node ([`policy`]), the node as backends see it
//! ([`node_context`]), the packet tracer ([`trace`]), and the `service-proxy-name` key.

pub mod family;
pub mod names;
pub mod node_context;
pub mod policy;
pub mod trace;
pub mod types;

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
