//! `kpx-dataplane --probe ready|live`: the pod's probes, run inside the agent's
//! container. The agent listens on the node's network (hostNetwork), where any process
//! can hold a port: kube-proxy's own healthz server answered an HTTP probe for agents
//! that had crashed. So the probe asks `/readyz`, whose body names the agent's pod, and
//! takes only an answer from its own pod's agent.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use crate::config::ProbeKind;

const TIMEOUT: Duration = Duration::from_secs(3);

/// Why a probe failed.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error("{address}: {source}")]
    Io { address: SocketAddr, source: std::io::Error },
    #[error("{address}{path}: not an HTTP answer")]
    NotHttp { address: SocketAddr, path: &'static str },
    #[error("{address}{path}: answered by another pod's agent or another process: {body}")]
    NotThisPod { address: SocketAddr, path: &'static str, body: String },
    #[error("{address}{path}: {status} {body}")]
    Unhealthy { address: SocketAddr, path: &'static str, status: u16, body: String },
}

/// Ok when the agent at `healthz` (of pod `pod_uid`, if given) answers `kind` with 200.
pub fn probe(kind: ProbeKind, healthz: SocketAddr, pod_uid: Option<&str>) -> Result<(), ProbeError> {
    let (status, body) = get(healthz, "/readyz")?;
    if let Some(uid) = pod_uid {
        if !body.contains(&format!("\"pod\":\"{uid}\"")) {
            return Err(ProbeError::NotThisPod { address: healthz, path: "/readyz", body });
        }
    }
    let (path, status, body) = match kind {
        ProbeKind::Ready => ("/readyz", status, body),
        ProbeKind::Live => {
            let (status, body) = get(healthz, "/livez")?;
            ("/livez", status, body)
        }
    };
    if status != 200 {
        return Err(ProbeError::Unhealthy { address: healthz, path, status, body });
    }
    Ok(())
}

fn get(address: SocketAddr, path: &'static str) -> Result<(u16, String), ProbeError> {
    let io = |source| ProbeError::Io { address, source };
    let mut stream = TcpStream::connect_timeout(&address, TIMEOUT).map_err(io)?;
    stream.set_read_timeout(Some(TIMEOUT)).map_err(io)?;
    stream.set_write_timeout(Some(TIMEOUT)).map_err(io)?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {address}\r\nConnection: close\r\n\r\n").map_err(io)?;
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).map_err(io)?;
    let text = String::from_utf8_lossy(&answer);
    let (head, body) = text.split_once("\r\n\r\n").ok_or(ProbeError::NotHttp { address, path })?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or(ProbeError::NotHttp { address, path })?;
    Ok((status, body.trim().to_owned()))
}
