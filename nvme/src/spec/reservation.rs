//! Reservations (NVMe Base Specification 2.0, 8.19 and the NVM Command Set's Reservation commands): the
//! actions and types as they sit in CDW10, the commands' data, and the Reservation Status extended data
//! structure that Reservation Report returns (hosts are named by their 128-bit Host Identifier, the one
//! NVMe over Fabrics hosts give in Connect).

use super::bytes::{get_u16, get_u32, get_u64, put_u16, put_u32};

/// Bytes of Reservation Register and Acquire data (two keys); Release carries the first 8.
pub const RESERVATION_KEYS_BYTES: usize = 16;
/// Bytes of the extended status header; each registrant entry is as long.
pub const RESERVATION_STATUS_ENTRY_BYTES: usize = 64;

/// Who may do what while a reservation is held (RTYPE).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum ReservationType {
    /// Only the holder writes; anyone reads.
    WriteExclusive = 1,
    /// Only the holder reads or writes.
    ExclusiveAccess = 2,
    /// Registrants write; anyone reads.
    WriteExclusiveRegistrantsOnly = 3,
    /// Only registrants read or write.
    ExclusiveAccessRegistrantsOnly = 4,
    /// Every registrant holds it and writes; anyone reads.
    WriteExclusiveAllRegistrants = 5,
    /// Every registrant holds it; only registrants read or write.
    ExclusiveAccessAllRegistrants = 6,
}

impl ReservationType {
    /// Decodes RTYPE.
    pub fn from_u8(value: u8) -> Option<Self> {
        Some(match value {
            1 => Self::WriteExclusive,
            2 => Self::ExclusiveAccess,
            3 => Self::WriteExclusiveRegistrantsOnly,
            4 => Self::ExclusiveAccessRegistrantsOnly,
            5 => Self::WriteExclusiveAllRegistrants,
            6 => Self::ExclusiveAccessAllRegistrants,
            _ => return None,
        })
    }

    /// Whether every registrant is a holder.
    pub fn all_registrants(self) -> bool {
        matches!(self, Self::WriteExclusiveAllRegistrants | Self::ExclusiveAccessAllRegistrants)
    }

    /// Whether a host that does not hold it may `write` (else read): registrants under the registrants-only
    /// and all-registrants types, anyone's reads under the write-exclusive ones.
    pub fn allows(self, registered: bool, write: bool) -> bool {
        match self {
            Self::WriteExclusive => !write,
            Self::ExclusiveAccess => false,
            Self::WriteExclusiveRegistrantsOnly | Self::WriteExclusiveAllRegistrants => registered || !write,
            Self::ExclusiveAccessRegistrantsOnly | Self::ExclusiveAccessAllRegistrants => registered,
        }
    }
}

/// Reservation Register's action (RREGA, CDW10 bits 2:0).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RegisterAction {
    /// Register the new key.
    Register = 0,
    /// Unregister the current key.
    Unregister = 1,
    /// Replace the current key with the new one.
    Replace = 2,
}

/// Reservation Acquire's action (RACQA, CDW10 bits 2:0).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AcquireAction {
    /// Take the reservation if nobody holds it.
    Acquire = 0,
    /// Take it from the registrants of the preempted key, unregistering them.
    Preempt = 1,
    /// Preempt, and abort the preempted hosts' commands.
    PreemptAndAbort = 2,
}

/// Reservation Release's action (RRELA, CDW10 bits 2:0).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReleaseAction {
    /// Give the reservation up.
    Release = 0,
    /// Give it up and unregister every registrant.
    Clear = 1,
}

/// CDW10 of a Reservation command: its action (bits 2:0), Ignore Existing Key (bit 3) and, for Acquire
/// and Release, the type (bits 15:8).
pub fn reservation_cdw10(action: u8, ignore_existing_key: bool, rtype: Option<ReservationType>) -> u32 {
    u32::from(action & 7) | (u32::from(ignore_existing_key) << 3) | (u32::from(rtype.map_or(0, |t| t as u8)) << 8)
}

/// Two keys as Register (current, new) and Acquire (current, preempt) send them; Release sends the first.
pub fn encode_keys(first: u64, second: u64) -> [u8; RESERVATION_KEYS_BYTES] {
    let mut bytes = [0u8; RESERVATION_KEYS_BYTES];
    bytes[0..8].copy_from_slice(&first.to_le_bytes());
    bytes[8..16].copy_from_slice(&second.to_le_bytes());
    bytes
}

/// The keys of a command's data (a missing second key reads 0).
pub fn decode_keys(bytes: &[u8]) -> (u64, u64) {
    let first = if bytes.len() >= 8 { get_u64(bytes, 0) } else { 0 };
    let second = if bytes.len() >= 16 { get_u64(bytes, 8) } else { 0 };
    (first, second)
}

/// One registrant in a report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Registrant {
    /// The controller it registered through.
    pub cntlid: u16,
    /// Whether it holds the reservation.
    pub holds: bool,
    /// Its key.
    pub key: u64,
    /// Its Host Identifier.
    pub host_id: [u8; 16],
}

/// The Reservation Status extended data structure.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReservationStatus {
    /// Generation: counts registrations, preemptions and clears.
    pub generation: u32,
    /// The reservation held (`None`: none).
    pub rtype: Option<ReservationType>,
    /// The registrants.
    pub registrants: Vec<Registrant>,
}

impl ReservationStatus {
    /// Its bytes: a 64-byte header, then 64 bytes per registrant.
    pub fn encode(&self) -> Vec<u8> {
        let mut bytes = vec![0u8; RESERVATION_STATUS_ENTRY_BYTES * (1 + self.registrants.len())];
        put_u32(&mut bytes, 0, self.generation);
        bytes[4] = self.rtype.map_or(0, |rtype| rtype as u8);
        put_u16(&mut bytes, 5, self.registrants.len() as u16);
        for (index, registrant) in self.registrants.iter().enumerate() {
            let at = RESERVATION_STATUS_ENTRY_BYTES * (index + 1);
            put_u16(&mut bytes, at, registrant.cntlid);
            bytes[at + 2] = u8::from(registrant.holds);
            bytes[at + 8..at + 16].copy_from_slice(&registrant.key.to_le_bytes());
            bytes[at + 16..at + 32].copy_from_slice(&registrant.host_id);
        }
        bytes
    }

    /// Decodes a report, as many registrants as `bytes` holds whole.
    pub fn decode(bytes: &[u8]) -> Option<Self> {
        if bytes.len() < RESERVATION_STATUS_ENTRY_BYTES {
            return None;
        }
        let count = usize::from(get_u16(bytes, 5));
        let whole = bytes.len() / RESERVATION_STATUS_ENTRY_BYTES - 1;
        let registrants = (0..count.min(whole))
            .map(|index| {
                let at = RESERVATION_STATUS_ENTRY_BYTES * (index + 1);
                let mut host_id = [0u8; 16];
                host_id.copy_from_slice(&bytes[at + 16..at + 32]);
                Registrant {
                    cntlid: get_u16(bytes, at),
                    holds: bytes[at + 2] & 1 != 0,
                    key: get_u64(bytes, at + 8),
                    host_id,
                }
            })
            .collect();
        Some(Self { generation: get_u32(bytes, 0), rtype: ReservationType::from_u8(bytes[4]), registrants })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_round_trips_and_lays_out_as_the_specification_draws_it() {
        let status = ReservationStatus {
            generation: 7,
            rtype: Some(ReservationType::ExclusiveAccessRegistrantsOnly),
            registrants: vec![Registrant { cntlid: 3, holds: true, key: 0xabcd, host_id: [9; 16] }],
        };
        let bytes = status.encode();
        assert_eq!(bytes.len(), 128);
        assert_eq!((bytes[0], bytes[4], bytes[5]), (7, 4, 1), "GEN, RTYPE, REGCTL");
        assert_eq!(
            (bytes[64], bytes[66], bytes[72], bytes[73], bytes[80]),
            (3, 1, 0xcd, 0xab, 9),
            "CNTLID RCSTS RKEY HOSTID"
        );
        assert_eq!(ReservationStatus::decode(&bytes), Some(status));
        assert_eq!(ReservationStatus::decode(&bytes[..64]).map(|cut| cut.registrants.len()), Some(0));
    }

    #[test]
    fn access_follows_the_types_table() {
        use ReservationType::*;
        // (type, registered non-holder may read, may write, unregistered may read, may write)
        let table = [
            (WriteExclusive, true, false, true, false),
            (ExclusiveAccess, false, false, false, false),
            (WriteExclusiveRegistrantsOnly, true, true, true, false),
            (ExclusiveAccessRegistrantsOnly, true, true, false, false),
            (WriteExclusiveAllRegistrants, true, true, true, false),
            (ExclusiveAccessAllRegistrants, true, true, false, false),
        ];
        for (rtype, reg_read, reg_write, other_read, other_write) in table {
            assert_eq!(
                (
                    rtype.allows(true, false),
                    rtype.allows(true, true),
                    rtype.allows(false, false),
                    rtype.allows(false, true)
                ),
                (reg_read, reg_write, other_read, other_write),
                "{rtype:?}"
            );
            assert_eq!(ReservationType::from_u8(rtype as u8), Some(rtype));
        }
        assert_eq!(reservation_cdw10(1, true, Some(ExclusiveAccess)), 0x209);
    }
}
