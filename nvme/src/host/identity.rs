//! Who this host is to a target: its Host NQN (what allow-lists name) and its Host Identifier (what
//! reservations are held by). Strata's host takes the machine's own, as the Linux NVMe tools keep them
//! (`/etc/nvme/hostnqn`, `/etc/nvme/hostid`), so that a target's allow-list written for the machine admits
//! it and two machines never pass for one host; where the files are absent, both derive from
//! `/etc/machine-id`, stable across restarts.

use std::sync::OnceLock;

/// The NQN prefix of a host named by a UUID (NVMe Base 2.0, 4.5).
const UUID_NQN: &str = "nqn.2014-08.org.nvmexpress:uuid:";
/// The identity of a machine that has neither the files nor a machine id.
const FALLBACK: [u8; 16] =
    [0x5f, 0x9a, 0x6c, 0x2e, 0x8d, 0x1b, 0x4f, 0x0e, 0x9a, 0x57, 0x3c, 0x2d, 0x1e, 0x0f, 0x4b, 0x6a];

/// This machine's Host NQN and Host Identifier, read once.
pub fn machine_identity() -> (String, [u8; 16]) {
    static IDENTITY: OnceLock<(String, [u8; 16])> = OnceLock::new();
    IDENTITY
        .get_or_init(|| {
            let read = |path: &str| std::fs::read_to_string(path).ok();
            identity_from(
                read("/etc/nvme/hostnqn").as_deref(),
                read("/etc/nvme/hostid").as_deref(),
                read("/etc/machine-id").as_deref(),
            )
        })
        .clone()
}

/// The identity the three files give (each may be absent or malformed).
pub fn identity_from(hostnqn: Option<&str>, hostid: Option<&str>, machine_id: Option<&str>) -> (String, [u8; 16]) {
    let hostnqn = hostnqn.map(str::trim).filter(|nqn| nqn.starts_with("nqn.") && nqn.len() <= 223);
    let from_nqn = hostnqn.and_then(|nqn| nqn.strip_prefix(UUID_NQN)).and_then(parse_hex_id);
    let id =
        hostid.and_then(parse_hex_id).or(from_nqn).or_else(|| machine_id.and_then(parse_hex_id)).unwrap_or(FALLBACK);
    let nqn = hostnqn.map_or_else(|| format!("{UUID_NQN}{}", uuid_text(&id)), str::to_string);
    (nqn, id)
}

/// The Host Identifier of one of several hosts on a machine whose own identifier is `machine`: each node of
/// a cluster is its own host to a target (reservations tell nodes apart by it), so two nodes on one machine
/// must not share one. Stable: the same `name` gives the same identifier after a restart (FNV-1a, fixed).
pub fn node_host_id(machine: &[u8; 16], name: &str) -> [u8; 16] {
    let half = |seed: u64| {
        let mut hash = 0xcbf2_9ce4_8422_2325u64 ^ seed;
        for &byte in machine.iter().chain(name.as_bytes()) {
            hash = (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3);
        }
        hash.to_be_bytes()
    };
    let mut id = [0u8; 16];
    id[..8].copy_from_slice(&half(1));
    id[8..].copy_from_slice(&half(2));
    id
}

/// 16 bytes from 32 hex digits, with or without a UUID's dashes.
fn parse_hex_id(text: &str) -> Option<[u8; 16]> {
    let digits: Vec<u8> = text.trim().bytes().filter(|&byte| byte != b'-').collect();
    if digits.len() != 32 {
        return None;
    }
    let mut id = [0u8; 16];
    for (at, pair) in digits.chunks_exact(2).enumerate() {
        id[at] = u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok()?;
    }
    Some(id)
}

fn uuid_text(id: &[u8; 16]) -> String {
    let hex: String = id.iter().map(|byte| format!("{byte:02x}")).collect();
    format!("{}-{}-{}-{}-{}", &hex[0..8], &hex[8..12], &hex[12..16], &hex[16..20], &hex[20..32])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_files_win_and_the_machine_id_stands_in() {
        let nqn = "nqn.2014-08.org.nvmexpress:uuid:66a8ceed-6437-49f5-b8be-635ca5139b9b\n";
        let (name, id) = identity_from(Some(nqn), Some("11111111-2222-3333-4444-555555555555\n"), None);
        assert_eq!(name, nqn.trim());
        assert_eq!(id[0..2], [0x11, 0x11]);
        // No hostid file: the NQN's UUID is the identifier, as nvme-cli derives it.
        let (_, id) = identity_from(Some(nqn), None, Some("3d1219c7c4c5404aaa1f6d2a48adfda4"));
        assert_eq!(id[0..4], [0x66, 0xa8, 0xce, 0xed]);
        // Neither file: both from the machine id.
        let (name, id) = identity_from(None, Some("not hex"), Some("3d1219c7c4c5404aaa1f6d2a48adfda4\n"));
        assert_eq!(name, "nqn.2014-08.org.nvmexpress:uuid:3d1219c7-c4c5-404a-aa1f-6d2a48adfda4");
        assert_eq!(id[15], 0xa4);
        assert_eq!(identity_from(None, None, None).1, FALLBACK);
    }

    #[test]
    fn nodes_on_one_machine_are_distinct_hosts_across_restarts() {
        let machine = [7u8; 16];
        let first = node_host_id(&machine, "prod/n1");
        assert_eq!(first, node_host_id(&machine, "prod/n1"), "stable");
        assert_ne!(first, node_host_id(&machine, "prod/n2"));
        assert_ne!(first, node_host_id(&[8u8; 16], "prod/n1"), "another machine");
        assert_ne!(first[..8], first[8..]);
    }
}
