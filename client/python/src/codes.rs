//! Return codes: Mooncake's `ErrorCode` values where Mooncake has one for the failure, so that an engine's
//! existing checks (`rc < 0`, `rc == -704`) keep their meaning; Strata's own failures (a checksum, a
//! storage error, a quota) take codes below -2000, outside Mooncake's ranges.

use strata_client::ClientError;

/// Success.
pub const OK: i64 = 0;
/// Mooncake `INTERNAL_ERROR`: the node answered something this client does not understand.
pub const INTERNAL_ERROR: i64 = -1;
/// Mooncake `NO_AVAILABLE_HANDLE`: no room on the node.
pub const NO_AVAILABLE_HANDLE: i64 = -200;
/// Mooncake `INVALID_PARAMS`: bad arguments (unregistered buffer, too small, key too long, no setup).
pub const INVALID_PARAMS: i64 = -600;
/// Mooncake `ILLEGAL_CLIENT`: the node refused the token.
pub const ILLEGAL_CLIENT: i64 = -601;
/// Mooncake `OBJECT_NOT_FOUND`.
pub const OBJECT_NOT_FOUND: i64 = -704;
/// Mooncake `OBJECT_ALREADY_EXISTS`: a put of a stored key (use `upsert` to replace it).
pub const OBJECT_ALREADY_EXISTS: i64 = -705;
/// Mooncake `RPC_FAIL`: the connection failed or timed out.
pub const RPC_FAIL: i64 = -900;
/// Mooncake `UNAVAILABLE_IN_CURRENT_STATUS`: the node is shutting down.
pub const UNAVAILABLE_IN_CURRENT_STATUS: i64 = -1010;
/// Strata: the stored bytes (or the bytes received) failed their checksum; nothing damaged was returned.
pub const CHECKSUM_MISMATCH: i64 = -2001;
/// Strata: the node's storage device failed.
pub const STORAGE_ERROR: i64 = -2002;
/// Strata: over a limit of the node (e.g. its pinned bytes).
pub const QUOTA_EXCEEDED: i64 = -2003;
/// Strata: in a cluster, the key moved to other nodes, and a retry under the new membership moved again.
pub const KEY_MOVED: i64 = -2004;
/// Mooncake's TRANSFER_FAIL: moving the bytes failed (RDMA).
pub const TRANSFER_FAIL: i64 = -800;

/// Every code with its name, for the Python module's constants and `error_name`.
pub const ALL: [(&str, i64); 14] = [
    ("OK", OK),
    ("INTERNAL_ERROR", INTERNAL_ERROR),
    ("NO_AVAILABLE_HANDLE", NO_AVAILABLE_HANDLE),
    ("INVALID_PARAMS", INVALID_PARAMS),
    ("ILLEGAL_CLIENT", ILLEGAL_CLIENT),
    ("OBJECT_NOT_FOUND", OBJECT_NOT_FOUND),
    ("OBJECT_ALREADY_EXISTS", OBJECT_ALREADY_EXISTS),
    ("RPC_FAIL", RPC_FAIL),
    ("UNAVAILABLE_IN_CURRENT_STATUS", UNAVAILABLE_IN_CURRENT_STATUS),
    ("CHECKSUM_MISMATCH", CHECKSUM_MISMATCH),
    ("STORAGE_ERROR", STORAGE_ERROR),
    ("QUOTA_EXCEEDED", QUOTA_EXCEEDED),
    ("KEY_MOVED", KEY_MOVED),
    ("TRANSFER_FAIL", TRANSFER_FAIL),
];

/// The code of a client error.
pub fn of(error: &ClientError) -> i64 {
    match error {
        ClientError::NotFound => OBJECT_NOT_FOUND,
        ClientError::Exists => OBJECT_ALREADY_EXISTS,
        // A cluster upsert ordered before a newer one that the replicas keep: Mooncake answers two racing
        // upserts with 0 each (the later one stands), and so does Strata.
        ClientError::Superseded => OK,
        ClientError::Checksum => CHECKSUM_MISMATCH,
        ClientError::Io => STORAGE_ERROR,
        ClientError::NoSpace => NO_AVAILABLE_HANDLE,
        ClientError::Quota => QUOTA_EXCEEDED,
        ClientError::Moved { .. } => KEY_MOVED,
        ClientError::TooLarge(_) | ClientError::Invalid(_) | ClientError::BufferTooSmall { .. } => INVALID_PARAMS,
        ClientError::Timeout | ClientError::Connection(_) => RPC_FAIL,
        // Mooncake's code for a failed transfer of the transfer engine.
        ClientError::Transfer => TRANSFER_FAIL,
        ClientError::Unauthenticated => ILLEGAL_CLIENT,
        ClientError::Protocol(_) => INTERNAL_ERROR,
        ClientError::ShuttingDown => UNAVAILABLE_IN_CURRENT_STATUS,
    }
}

/// `0` for success, else the error's code.
pub fn of_unit(result: &Result<(), ClientError>) -> i64 {
    result.as_ref().map_or_else(of, |()| OK)
}

/// The length for success, else the error's code.
pub fn of_len(result: &Result<usize, ClientError>) -> i64 {
    result.as_ref().map_or_else(of, |&len| len as i64)
}
