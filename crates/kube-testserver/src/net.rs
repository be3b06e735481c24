//! The TCP listener, with the "refuse" outage: new connections are dropped and open ones reset.

use crate::faults::{Faults, Outage};
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};

/// A listener that honours the refuse outage.
pub struct FaultyListener {
    /// The bound socket.
    pub inner: TcpListener,
    /// Fault state.
    pub faults: Faults,
}

/// A connection that fails while the server refuses service.
pub struct FaultyStream {
    inner: TcpStream,
    faults: Faults,
}

impl axum::serve::Listener for FaultyListener {
    type Io = FaultyStream;
    type Addr = std::net::SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            match self.inner.accept().await {
                Ok((s, a)) => {
                    if self.faults.outage() == Outage::Refuse {
                        drop(s);
                        continue;
                    }
                    let _ = s.set_nodelay(true);
                    return (
                        FaultyStream {
                            inner: s,
                            faults: self.faults.clone(),
                        },
                        a,
                    );
                }
                Err(_) => tokio::time::sleep(std::time::Duration::from_millis(10)).await,
            }
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.inner.local_addr()
    }
}

fn refused() -> io::Error {
    io::Error::new(io::ErrorKind::ConnectionReset, "injected outage: refusing")
}

impl AsyncRead for FaultyStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.faults.outage() == Outage::Refuse {
            return Poll::Ready(Err(refused()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for FaultyStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if self.faults.outage() == Outage::Refuse {
            return Poll::Ready(Err(refused()));
        }
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
