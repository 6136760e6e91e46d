//! The system calls the node needs that std and glommio do not wrap: adopting a bound listener into
//! glommio, shutting a socket down from another thread, reading the CPUs the process may use.

use std::os::fd::{IntoRawFd, RawFd};

/// Hands a bound, listening std socket to glommio (on the calling executor).
pub fn adopt_listener(listener: std::net::TcpListener) -> glommio::net::TcpListener {
    use std::os::fd::FromRawFd;
    let fd = listener.into_raw_fd();
    // SAFETY: `fd` is a bound, listening TCP socket whose ownership `into_raw_fd` just gave up; the glommio
    // listener is its only owner from here on.
    #[allow(unsafe_code)]
    unsafe {
        glommio::net::TcpListener::from_raw_fd(fd)
    }
}

/// Shuts a socket down (both directions): a pending `accept` on it returns an error.
pub fn shutdown_socket(fd: RawFd) {
    // SAFETY: shutdown(2) on a descriptor number has no memory effects; if the descriptor was closed
    // meanwhile, the call fails with EBADF (or affects a socket that replaced it, which the node does not
    // do: listeners are closed only after their shard stopped).
    #[allow(unsafe_code)]
    unsafe {
        libc::shutdown(fd, libc::SHUT_RDWR);
    }
}

/// The CPUs the calling thread may run on (its affinity mask); every online CPU if the mask cannot be read.
pub fn allowed_cpus() -> Vec<usize> {
    // SAFETY: `set` is a plain bit set the kernel fills; CPU_ISSET reads within it.
    #[allow(unsafe_code)]
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            let online = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
            return (0..online).collect();
        }
        (0..libc::CPU_SETSIZE as usize).filter(|&cpu| libc::CPU_ISSET(cpu, &set)).collect()
    }
}
