//! A client connection's socket: TCP (through the reactor or polled, see `strata_nvme::tcp::stream`), or
//! the node's Unix socket for a client on its host, which may also pass memory to register.

use std::io;
use std::os::fd::RawFd;

use strata_nvme::tcp::stream::Socket;

use super::local_socket::LocalSocket;

/// The socket a connection reads and writes.
pub(crate) enum ClientStream {
    Tcp(Socket),
    Local(LocalSocket),
}

impl ClientStream {
    pub(crate) fn raw_fd(&self) -> RawFd {
        match self {
            ClientStream::Tcp(socket) => socket.raw_fd(),
            ClientStream::Local(socket) => socket.raw_fd(),
        }
    }

    pub(crate) async fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            ClientStream::Tcp(socket) => socket.read(buf).await,
            ClientStream::Local(socket) => socket.read(buf).await,
        }
    }

    /// Fills `buf` (either socket: the loop over `read` serves both).
    pub(crate) async fn read_exact(&mut self, mut buf: &mut [u8]) -> io::Result<()> {
        while !buf.is_empty() {
            let read = self.read(buf).await?;
            if read == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            buf = &mut buf[read..];
        }
        Ok(())
    }

    pub(crate) async fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        match self {
            ClientStream::Tcp(socket) => socket.write_all(buf).await,
            ClientStream::Local(socket) => socket.write_all(buf).await,
        }
    }

    /// Writes all of `bufs` in order (a local connection's replies are mostly headers alone: gathered into
    /// one write).
    pub(crate) async fn write_all_vectored(&mut self, bufs: &mut [io::IoSlice<'_>]) -> io::Result<()> {
        match self {
            ClientStream::Tcp(socket) => socket.write_all_vectored(bufs).await,
            ClientStream::Local(socket) => {
                let mut gathered = Vec::with_capacity(bufs.iter().map(|buf| buf.len()).sum());
                for buf in bufs.iter() {
                    gathered.extend_from_slice(buf);
                }
                socket.write_all(&gathered).await
            }
        }
    }

    pub(crate) async fn shutdown(&mut self) -> io::Result<()> {
        match self {
            ClientStream::Tcp(socket) => socket.shutdown().await,
            ClientStream::Local(socket) => socket.shutdown().await,
        }
    }
}
