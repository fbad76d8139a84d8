//! Connections of `--listen` that the control plane can close from a stream.
//!
//! A node that stops reading its stream leaves its response buffered in HTTP/2, which
//! then stops asking the response for more: nothing on the stream's side runs again,
//! and a gRPC status could not reach the node anyway. So a stream that gives up on its
//! node (no ACK within `--ack-timeout`) closes the node's connection: every read and
//! write of it fails from then on, HTTP/2 ends the connection, and what it held is freed.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::task::AtomicWaker;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tonic::transport::server::Connected;

/// Closes one connection.
#[derive(Clone, Debug, Default)]
pub struct ConnectionCloser(Arc<Closing>);

#[derive(Debug, Default)]
struct Closing {
    closed: AtomicBool,
    /// The task reading the connection (HTTP/2's), woken to find it closed.
    reader: AtomicWaker,
}

impl ConnectionCloser {
    /// Closes the connection: its next read or write fails.
    pub fn close(&self) {
        self.0.closed.store(true, Ordering::SeqCst);
        self.0.reader.wake();
    }

    fn is_closed(&self) -> bool {
        self.0.closed.load(Ordering::SeqCst)
    }
}

fn aborted() -> io::Error {
    io::Error::new(io::ErrorKind::ConnectionAborted, "closed by the control plane")
}

/// A connection (TCP, or TLS over TCP) that a [`ConnectionCloser`] can close.
pub struct Closable<IO> {
    io: IO,
    closer: ConnectionCloser,
}

impl<IO> Closable<IO> {
    pub fn new(io: IO) -> Self {
        Closable { io, closer: ConnectionCloser::default() }
    }
}

/// What a request knows of its connection: the transport's own information (peer
/// address, client certificates) and how to close it.
#[derive(Clone, Debug)]
pub struct ConnectionInfo<I> {
    pub transport: I,
    pub closer: ConnectionCloser,
}

impl<IO: Connected> Connected for Closable<IO> {
    type ConnectInfo = ConnectionInfo<IO::ConnectInfo>;

    fn connect_info(&self) -> Self::ConnectInfo {
        ConnectionInfo { transport: self.io.connect_info(), closer: self.closer.clone() }
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Closable<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.closer.is_closed() {
            return Poll::Ready(Err(aborted()));
        }
        let read = Pin::new(&mut self.io).poll_read(cx, buf);
        if read.is_pending() {
            // Registered only while it waits (every read of the connection passes here);
            // checked again after, so a close in between is not missed.
            self.closer.0.reader.register(cx.waker());
            if self.closer.is_closed() {
                return Poll::Ready(Err(aborted()));
            }
        }
        read
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Closable<IO> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        if self.closer.is_closed() {
            return Poll::Ready(Err(aborted()));
        }
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        if self.closer.is_closed() {
            return Poll::Ready(Err(aborted()));
        }
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    #[tokio::test]
    async fn a_closed_connection_wakes_its_reader_and_fails_reads_and_writes() {
        let (ours, mut theirs) = tokio::io::duplex(64);
        let mut conn = Closable::new(ours);
        let closer = conn.closer.clone();
        theirs.write_all(b"ping").await.expect("write");
        let mut buf = [0u8; 4];
        conn.read_exact(&mut buf).await.expect("read before closing");
        // A read waiting for data ends when the connection is closed.
        let reader = tokio::spawn(async move {
            let mut byte = [0u8; 1];
            let read = conn.read(&mut byte).await;
            (conn, read)
        });
        tokio::task::yield_now().await;
        closer.close();
        let (mut conn, read) = tokio::time::timeout(std::time::Duration::from_secs(5), reader)
            .await
            .expect("woken")
            .expect("task");
        assert_eq!(read.expect_err("closed").kind(), io::ErrorKind::ConnectionAborted);
        let write = conn.write_all(b"pong").await;
        assert_eq!(write.expect_err("closed").kind(), io::ErrorKind::ConnectionAborted);
    }
}
