//! The TLS side of `--listen`: every accepted connection's handshake runs on its own (a
//! slow or stuck client holds up no one), with the server configuration of the moment
//! (rotated files are taken up by the next connection). A handshake that fails — a
//! plaintext client, a certificate of another CA or out of date — is logged with the
//! peer and the reason, and the connection closed.

use std::sync::Arc;
use std::time::Duration;

use kpx_proto::tls::ReloadingServerConfig;
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::server::TlsStream;
use tokio_stream::wrappers::ReceiverStream;

use super::connection::Closable;

/// How long a client may take to finish its handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The TLS connections of `listener`, as tonic's server takes them.
pub fn incoming(
    listener: TcpListener,
    config: Arc<ReloadingServerConfig>,
) -> ReceiverStream<std::io::Result<Closable<TlsStream<TcpStream>>>> {
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    tokio::spawn(async move {
        loop {
            let (tcp, peer) = match listener.accept().await {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let acceptor = tokio_rustls::TlsAcceptor::from(config.current());
            let tx = tx.clone();
            tokio::spawn(async move {
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                    Ok(Ok(tls)) => {
                        let _ = tx.send(Ok(Closable::new(tls))).await;
                    }
                    Ok(Err(e)) => {
                        tracing::warn!(%peer, error = %e, "TLS handshake refused (a plaintext client, or a certificate of another CA or out of date?)")
                    }
                    Err(_) => tracing::warn!(%peer, "TLS handshake not finished in time"),
                }
            });
        }
    });
    ReceiverStream::new(rx)
}
