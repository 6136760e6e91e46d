//! The node's side of a connection over its Unix socket: bytes read with `recvmsg`, so that descriptors a
//! client passes (`SCM_RIGHTS`, a memfd it registers) are kept rather than dropped by the kernel, and
//! writes through glommio's reactor.
//!
//! A read is tried without blocking first; when nothing is there it waits on the reactor for the socket to
//! become readable (a `MSG_PEEK` receive of one byte, which consumes nothing) and tries again, or, on a
//! node that busy-polls its sockets, yields and tries again (`idle_poll`) until the connection has been
//! quiet for `--busy-poll-idle`, then waits as above. A busy connection thus costs one system call per
//! read, an idle one nothing. A write is a non-blocking send first too, and goes through the reactor only
//! for what the socket's buffer did not take. glommio's stream does not give its descriptor out, so it
//! runs on a duplicate of the one `recvmsg` reads.

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, OwnedFd, RawFd};

use futures_lite::AsyncWriteExt;
use glommio::net::UnixStream;

/// Descriptors a connection may have received and not yet used: each REGISTER takes one; a client that
/// sends more than this ahead of its frames breaks the protocol.
pub(super) const MAX_PENDING_DESCRIPTORS: usize = 8;
/// Room for the descriptors one `recvmsg` may carry.
const CONTROL_BYTES: usize = 256;

/// A client's connection over the node's Unix socket.
pub(crate) struct LocalSocket {
    /// What `recvmsg` reads.
    socket: std::os::unix::net::UnixStream,
    /// The same socket (a duplicate descriptor) through glommio's reactor: waits for input, writes.
    stream: UnixStream,
    /// Descriptors received in order, not yet taken by a REGISTER.
    descriptors: VecDeque<OwnedFd>,
    /// A read brought more descriptors than allowed, or the kernel cut the control data short.
    overrun: bool,
    /// Busy-poll for input instead of waiting on the reactor.
    polled: bool,
}

impl LocalSocket {
    pub(crate) fn new(socket: std::os::unix::net::UnixStream, polled: bool) -> io::Result<Self> {
        let duplicate = socket.try_clone()?.into_raw_fd();
        // SAFETY: `duplicate` is a fresh descriptor of a connected Unix stream socket that nothing else owns.
        #[allow(unsafe_code)]
        let stream = unsafe { UnixStream::from_raw_fd(duplicate) };
        Ok(Self { socket, stream, descriptors: VecDeque::new(), overrun: false, polled })
    }

    pub(crate) fn raw_fd(&self) -> RawFd {
        self.socket.as_raw_fd()
    }

    /// The oldest descriptor received and not yet taken.
    pub(crate) fn take_descriptor(&mut self) -> Option<OwnedFd> {
        self.descriptors.pop_front()
    }

    /// Reads what is there (at least one byte; 0 at end of stream), keeping any descriptors that came with
    /// it.
    pub(crate) async fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let mut idle = strata_nvme::tcp::stream::IdleWatch::default();
        loop {
            match self.receive(buf) {
                Err(error) if error.kind() == io::ErrorKind::WouldBlock && self.polled && !idle.too_long() => {
                    strata_nvme::tcp::stream::idle_poll(idle.misses).await;
                }
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => {
                    // Polled: quiet for longer than the executor lets a polled socket spin.
                    let _waiting = self.polled.then(strata_nvme::tcp::stream::reactor_wait);
                    let mut byte = [0u8; 1];
                    if self.stream.peek(&mut byte).await? == 0 {
                        return Ok(0);
                    }
                }
                Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                other => return other,
            }
        }
    }

    pub(crate) async fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        let sent = strata_nvme::tcp::send_without_waiting(self.socket.as_raw_fd(), &[io::IoSlice::new(buf)])?;
        if sent < buf.len() {
            // The socket's buffer is full: the rest waits on the reactor.
            self.stream.write_all(&buf[sent..]).await?;
        }
        Ok(())
    }

    pub(crate) async fn shutdown(&mut self) -> io::Result<()> {
        self.stream.shutdown(std::net::Shutdown::Both).await.map_err(Into::into)
    }

    /// One non-blocking `recvmsg` into `buf`; descriptors that came with the bytes are queued.
    fn receive(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.overrun {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "too many descriptors passed ahead of their frames",
            ));
        }
        let mut control = [0u64; CONTROL_BYTES / 8];
        let mut iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
        // SAFETY: an all-zero msghdr is valid (no name, no iovecs, no control); the fields set below point
        // at `iov`, `buf` and `control`, which outlive the call.
        #[allow(unsafe_code)]
        let mut message: libc::msghdr = unsafe { std::mem::zeroed() };
        message.msg_iov = &mut iov;
        message.msg_iovlen = 1;
        message.msg_control = control.as_mut_ptr().cast();
        message.msg_controllen = CONTROL_BYTES;
        // SAFETY: `message` describes memory that is valid for writes of the lengths it gives.
        #[allow(unsafe_code)]
        let read = unsafe {
            libc::recvmsg(self.socket.as_raw_fd(), &mut message, libc::MSG_DONTWAIT | libc::MSG_CMSG_CLOEXEC)
        };
        if read < 0 {
            return Err(io::Error::last_os_error());
        }
        self.keep_descriptors(&message);
        Ok(read as usize)
    }

    /// Queues the descriptors of `message`'s control data (each closed when dropped).
    fn keep_descriptors(&mut self, message: &libc::msghdr) {
        if message.msg_flags & libc::MSG_CTRUNC != 0 {
            self.overrun = true;
        }
        // SAFETY: the CMSG macros walk the control buffer the kernel just filled, within `msg_controllen`.
        #[allow(unsafe_code)]
        unsafe {
            let mut header = libc::CMSG_FIRSTHDR(message);
            while !header.is_null() {
                if (*header).cmsg_level == libc::SOL_SOCKET && (*header).cmsg_type == libc::SCM_RIGHTS {
                    let data = libc::CMSG_DATA(header).cast::<RawFd>();
                    let bytes = (*header).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
                    for index in 0..bytes / size_of::<RawFd>() {
                        let fd = OwnedFd::from_raw_fd(data.add(index).read_unaligned());
                        if self.descriptors.len() < MAX_PENDING_DESCRIPTORS {
                            self.descriptors.push_back(fd);
                        } else {
                            self.overrun = true;
                        }
                    }
                }
                header = libc::CMSG_NXTHDR(message, header);
            }
        }
    }
}
