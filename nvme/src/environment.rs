//! Start-up checks of the environment, each failing with an error that names the fix, rather than letting
//! the I/O path degrade or fail obscurely later.

use std::path::Path;

use crate::error::{BlockError, BlockErrorKind, BlockOp, BlockResult};

const TMPFS_MAGIC: i64 = 0x0102_1994;
const CAP_IPC_LOCK: u32 = 14;

/// Whether this process may lock memory without limit (root has `CAP_IPC_LOCK`).
pub fn has_cap_ipc_lock() -> bool {
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else {
        return false;
    };
    status
        .lines()
        .find_map(|line| line.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .is_some_and(|caps| caps & (1 << CAP_IPC_LOCK) != 0)
}

/// The soft `RLIMIT_MEMLOCK`, in bytes (`u64::MAX` when unlimited).
pub fn memlock_limit_bytes() -> u64 {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes one rlimit into the struct we own; no other memory is touched.
    #[allow(unsafe_code)]
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut limit) };
    if rc != 0 { 0 } else { limit.rlim_cur }
}

/// Checks that `executors` executors can each register `io_memory_bytes` of I/O memory (glommio pins it for
/// io_uring, and needs at least 512 KiB of memlock budget to start at all).
pub fn check_memlock_budget(io_memory_bytes: u64, executors: u64) -> BlockResult<()> {
    memlock_verdict(io_memory_bytes, executors, memlock_limit_bytes(), has_cap_ipc_lock())
}

/// The decision of [`check_memlock_budget`], apart from reading the process's limits.
fn memlock_verdict(io_memory_bytes: u64, executors: u64, limit: u64, cap_ipc_lock: bool) -> BlockResult<()> {
    if cap_ipc_lock {
        return Ok(());
    }
    let needed = io_memory_bytes.saturating_mul(executors).max(512 << 10);
    if limit >= needed {
        return Ok(());
    }
    Err(BlockError::new(
        BlockOp::Open,
        "io_uring",
        0,
        BlockErrorKind::Environment(format!(
            "the memlock limit is {limit} bytes but {executors} executor(s) need {needed} bytes of registered I/O \
             memory: raise it (`ulimit -l`, or memlock in /etc/security/limits.conf), run with CAP_IPC_LOCK \
             (e.g. as root), or lower the I/O depth or block size"
        )),
    ))
}

/// Checks that `path`'s file system supports `O_DIRECT` (tmpfs does not, and glommio would then silently
/// fall back to buffered I/O).
pub fn check_direct_io(path: &Path) -> BlockResult<()> {
    use std::os::unix::ffi::OsStrExt;
    let name = path.display().to_string();
    let environment =
        |message: String| Err(BlockError::new(BlockOp::Open, &name, 0, BlockErrorKind::Environment(message)));
    let Ok(c_path) = std::ffi::CString::new(path.as_os_str().as_bytes()) else {
        return environment("the path contains a NUL byte".into());
    };
    let mut stats: libc::statfs = zeroed_statfs();
    // SAFETY: statfs reads a NUL-terminated path we own and writes one statfs struct we own.
    #[allow(unsafe_code)]
    let rc = unsafe { libc::statfs(c_path.as_ptr(), &mut stats) };
    // `f_type`'s integer type differs between architectures; the conversion is the identity on x86_64.
    #[allow(clippy::useless_conversion)]
    let on_tmpfs = rc == 0 && i64::from(stats.f_type) == TMPFS_MAGIC;
    if on_tmpfs {
        return environment(
            "the file is on tmpfs, which does not support O_DIRECT: put it on a disk file system (ext4, xfs) \
             or use a block device"
                .into(),
        );
    }
    use std::os::unix::fs::OpenOptionsExt;
    match std::fs::OpenOptions::new().read(true).custom_flags(libc::O_DIRECT).open(path) {
        Ok(_) => Ok(()),
        Err(error) if error.raw_os_error() == Some(libc::EINVAL) => environment(
            "the file system refuses O_DIRECT: put the file on a file system that supports direct I/O (ext4, \
             xfs) or use a block device"
                .into(),
        ),
        Err(error) => Err(BlockError::new(BlockOp::Open, &name, 0, BlockErrorKind::Io(error))),
    }
}

fn zeroed_statfs() -> libc::statfs {
    // SAFETY: statfs is a plain C struct of integers, for which all-zero bytes are a valid value.
    #[allow(unsafe_code)]
    unsafe {
        std::mem::zeroed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_memlock_budget_names_the_fix_when_short() {
        assert!(memlock_verdict(8 << 20, 2, 64 << 20, false).is_ok());
        assert!(memlock_verdict(8 << 20, 2, 8 << 20, true).is_ok(), "CAP_IPC_LOCK lifts the limit");
        let error = memlock_verdict(8 << 20, 2, 8 << 20, false).unwrap_err().to_string();
        assert!(error.contains("16777216") && error.contains("ulimit -l") && error.contains("CAP_IPC_LOCK"), "{error}");
        // glommio's own floor: even tiny I/O memory needs 512 KiB.
        assert!(memlock_verdict(1, 1, 256 << 10, false).is_err());
    }

    #[test]
    fn tmpfs_is_refused_for_direct_io() {
        // Debian mounts tmpfs at /dev/shm on every machine this project runs on.
        let on_tmpfs = std::path::Path::new("/dev/shm");
        assert!(on_tmpfs.is_dir(), "no /dev/shm: this test needs a tmpfs mount there");
        let path = on_tmpfs.join(format!("strata-direct-io-check-{}", std::process::id()));
        std::fs::write(&path, [0u8; 4096]).unwrap();
        let result = check_direct_io(&path);
        std::fs::remove_file(&path).unwrap();
        let error = result.unwrap_err().to_string();
        assert!(error.contains("tmpfs") && error.contains("O_DIRECT"), "{error}");
    }
}
