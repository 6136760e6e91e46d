//! Waiting on the executor's reactor for a descriptor glommio does not own (an RDMA completion channel, an
//! event channel) to become readable.
//!
//! glommio has no call that waits for an arbitrary descriptor, but it arms a poll (`POLL_ADD` on its
//! io_uring) for a descriptor the moment it adopts it as a stream, and a read of that stream waits for the
//! poll before trying `recv`. So a duplicate of the descriptor, adopted as a `UnixStream`, is read once:
//! the read returns (with `ENOTSOCK`, the descriptor not being a socket) when it becomes readable, and the
//! duplicate is closed. A wait thus costs a `dup`, one poll on the reactor's ring and a `close`.

use std::os::fd::{FromRawFd, IntoRawFd, RawFd};

/// Returns once `fd` (not a socket) is readable, or at once if it could not be duplicated.
pub async fn readable(fd: RawFd) {
    // SAFETY: the caller keeps `fd` open while this waits; the duplicate is ours to close.
    #[allow(unsafe_code)]
    let duplicate = unsafe { libc::dup(fd) };
    if duplicate < 0 {
        futures_lite::future::yield_now().await;
        return;
    }
    // SAFETY: a descriptor nothing else owns; glommio polls it and closes it on drop. It is not a socket,
    // so the read below never consumes anything: it ends with ENOTSOCK once the poll says readable.
    #[allow(unsafe_code)]
    let mut stream = unsafe { glommio::net::UnixStream::from_raw_fd(duplicate) };
    let mut byte = [0u8; 1];
    let _ = futures_lite::AsyncReadExt::read(&mut stream, &mut byte).await;
}

/// A standard Unix socket adopted by the executor's reactor (made non-blocking), to be read with await.
pub fn adopt(stream: std::os::unix::net::UnixStream) -> std::io::Result<glommio::net::UnixStream> {
    stream.set_nonblocking(true)?;
    // SAFETY: the descriptor of a connected Unix socket, whose ownership moves to the glommio stream.
    #[allow(unsafe_code)]
    Ok(unsafe { glommio::net::UnixStream::from_raw_fd(stream.into_raw_fd()) })
}
