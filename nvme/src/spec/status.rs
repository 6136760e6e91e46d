//! Status codes (NVMe Base 2.0, 4.6.1.2; NVMe over Fabrics 1.1, 3.3.1.2).

use std::fmt;

/// Status code types.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StatusType {
    /// 0: generic command status.
    Generic,
    /// 1: command specific status.
    CommandSpecific,
    /// 2: media and data integrity errors.
    Media,
    /// 3: path related status.
    Path,
    /// 7: vendor specific; 4-6 are reserved.
    Other(u8),
}

/// The 15-bit status of a completion: SC, SCT, CRD, More, DNR.
#[derive(Clone, Copy, PartialEq, Eq, Default)]
pub struct NvmeStatus {
    /// Status code.
    pub sc: u8,
    /// Status code type (3 bits).
    pub sct: u8,
    /// Do Not Retry.
    pub dnr: bool,
}

impl NvmeStatus {
    const fn generic(sc: u8) -> Self {
        Self { sc, sct: 0, dnr: false }
    }

    const fn specific(sc: u8) -> Self {
        Self { sc, sct: 1, dnr: false }
    }

    /// Successful completion.
    pub const SUCCESS: Self = Self::generic(0x00);
    /// Invalid Command Opcode.
    pub const INVALID_OPCODE: Self = Self::generic(0x01);
    /// Invalid Field in Command.
    pub const INVALID_FIELD: Self = Self::generic(0x02);
    /// Command ID Conflict.
    pub const COMMAND_ID_CONFLICT: Self = Self::generic(0x03);
    /// Data Transfer Error.
    pub const DATA_TRANSFER_ERROR: Self = Self::generic(0x04);
    /// Internal Error.
    pub const INTERNAL_ERROR: Self = Self::generic(0x06);
    /// Command Abort Requested.
    pub const ABORT_REQUESTED: Self = Self::generic(0x07);
    /// Command Aborted due to SQ Deletion (used when a controller is torn down).
    pub const ABORTED_SQ_DELETION: Self = Self::generic(0x08);
    /// Invalid Namespace or Format.
    pub const INVALID_NAMESPACE: Self = Self::generic(0x0b);
    /// Transient Transport Error: the transport failed this command (e.g. its data digest did not match)
    /// but the connection stays up, so a retry may succeed.
    pub const TRANSIENT_TRANSPORT_ERROR: Self = Self::generic(0x22);
    /// Command Sequence Error.
    pub const COMMAND_SEQUENCE_ERROR: Self = Self::generic(0x0c);
    /// Data SGL Length Invalid.
    pub const SGL_LENGTH_INVALID: Self = Self::generic(0x0f);
    /// SGL Descriptor Type Invalid.
    pub const SGL_TYPE_INVALID: Self = Self::generic(0x11);
    /// SGL Offset Invalid.
    pub const SGL_OFFSET_INVALID: Self = Self::generic(0x16);
    /// LBA Out of Range.
    pub const LBA_OUT_OF_RANGE: Self = Self::generic(0x80);
    /// Namespace Not Ready.
    pub const NAMESPACE_NOT_READY: Self = Self::generic(0x82);
    /// The command conflicts with a reservation held on the namespace.
    pub const RESERVATION_CONFLICT: Self = Self::generic(0x83);
    /// A Reservation Report asked for 64-bit host identifiers where hosts have 128-bit ones.
    pub const HOST_ID_INCONSISTENT_FORMAT: Self = Self::generic(0x20);
    /// Invalid Queue Identifier (command specific).
    pub const INVALID_QUEUE_ID: Self = Self::specific(0x01);
    /// Invalid Queue Size (command specific).
    pub const INVALID_QUEUE_SIZE: Self = Self::specific(0x02);
    /// Asynchronous Event Request Limit Exceeded (command specific).
    pub const AER_LIMIT_EXCEEDED: Self = Self::specific(0x05);
    /// Invalid Log Page (command specific).
    pub const INVALID_LOG_PAGE: Self = Self::specific(0x09);
    /// Feature Identifier Not Saveable (command specific).
    pub const FEATURE_NOT_SAVEABLE: Self = Self::specific(0x0d);
    /// Connect Incompatible Format (Fabrics).
    pub const CONNECT_INCOMPATIBLE_FORMAT: Self = Self::specific(0x80);
    /// Connect Controller Busy (Fabrics).
    pub const CONNECT_CONTROLLER_BUSY: Self = Self::specific(0x81);
    /// Connect Invalid Parameters (Fabrics).
    pub const CONNECT_INVALID_PARAMETERS: Self = Self::specific(0x82);
    /// Connect Invalid Host (Fabrics): the host NQN is not allowed on the subsystem.
    pub const CONNECT_INVALID_HOST: Self = Self::specific(0x84);
    /// Invalid Queue Type (Fabrics).
    pub const INVALID_QUEUE_TYPE: Self = Self::specific(0x85);
    /// Write Fault (media).
    pub const WRITE_FAULT: Self = Self { sc: 0x80, sct: 2, dnr: false };
    /// Unrecovered Read Error (media).
    pub const UNRECOVERED_READ_ERROR: Self = Self { sc: 0x81, sct: 2, dnr: false };

    /// The same status with Do Not Retry set.
    pub const fn with_dnr(self) -> Self {
        Self { dnr: true, ..self }
    }

    /// Whether this is success.
    pub fn is_success(&self) -> bool {
        self.sc == 0 && self.sct == 0
    }

    /// The status code type.
    pub fn status_type(&self) -> StatusType {
        match self.sct {
            0 => StatusType::Generic,
            1 => StatusType::CommandSpecific,
            2 => StatusType::Media,
            3 => StatusType::Path,
            other => StatusType::Other(other),
        }
    }

    /// Bits 14:0 of the status field as the completion carries them above the phase tag: SC 7:0, SCT 10:8,
    /// DNR 14.
    pub fn to_field(&self) -> u16 {
        u16::from(self.sc) | (u16::from(self.sct & 0x7) << 8) | (u16::from(self.dnr) << 14)
    }

    /// Decodes bits 14:0 (CRD and More are not kept).
    pub fn from_field(field: u16) -> Self {
        Self { sc: field as u8, sct: ((field >> 8) & 0x7) as u8, dnr: field & (1 << 14) != 0 }
    }

    fn name(&self) -> Option<&'static str> {
        let plain = Self { dnr: false, ..*self };
        let named: &[(Self, &str)] = &[
            (Self::SUCCESS, "success"),
            (Self::INVALID_OPCODE, "invalid command opcode"),
            (Self::INVALID_FIELD, "invalid field in command"),
            (Self::COMMAND_ID_CONFLICT, "command ID conflict"),
            (Self::DATA_TRANSFER_ERROR, "data transfer error"),
            (Self::INTERNAL_ERROR, "internal error"),
            (Self::ABORT_REQUESTED, "command abort requested"),
            (Self::ABORTED_SQ_DELETION, "command aborted due to SQ deletion"),
            (Self::INVALID_NAMESPACE, "invalid namespace or format"),
            (Self::COMMAND_SEQUENCE_ERROR, "command sequence error"),
            (Self::SGL_LENGTH_INVALID, "data SGL length invalid"),
            (Self::SGL_TYPE_INVALID, "SGL descriptor type invalid"),
            (Self::SGL_OFFSET_INVALID, "SGL offset invalid"),
            (Self::LBA_OUT_OF_RANGE, "LBA out of range"),
            (Self::NAMESPACE_NOT_READY, "namespace not ready"),
            (Self::INVALID_QUEUE_ID, "invalid queue identifier"),
            (Self::INVALID_QUEUE_SIZE, "invalid queue size"),
            (Self::AER_LIMIT_EXCEEDED, "asynchronous event request limit exceeded"),
            (Self::INVALID_LOG_PAGE, "invalid log page"),
            (Self::FEATURE_NOT_SAVEABLE, "feature identifier not saveable"),
            (Self::CONNECT_INCOMPATIBLE_FORMAT, "connect: incompatible format"),
            (Self::CONNECT_CONTROLLER_BUSY, "connect: controller busy"),
            (Self::CONNECT_INVALID_PARAMETERS, "connect: invalid parameters"),
            (Self::CONNECT_INVALID_HOST, "connect: host not allowed on this subsystem"),
            (Self::INVALID_QUEUE_TYPE, "invalid queue type"),
            (Self::WRITE_FAULT, "write fault"),
            (Self::UNRECOVERED_READ_ERROR, "unrecovered read error"),
        ];
        named.iter().find(|(status, _)| *status == plain).map(|(_, name)| *name)
    }
}

impl fmt::Display for NvmeStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(name) => write!(f, "{name} (SCT {:#x}, SC {:#04x})", self.sct, self.sc)?,
            None => write!(f, "status SCT {:#x}, SC {:#04x}", self.sct, self.sc)?,
        }
        if self.dnr {
            f.write_str(", do not retry")?;
        }
        Ok(())
    }
}

impl fmt::Debug for NvmeStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_round_trips_and_names_itself() {
        for status in [NvmeStatus::SUCCESS, NvmeStatus::CONNECT_INVALID_HOST.with_dnr(), NvmeStatus::WRITE_FAULT] {
            assert_eq!(NvmeStatus::from_field(status.to_field()), status);
        }
        assert_eq!(NvmeStatus::CONNECT_INVALID_HOST.to_field(), 0x184);
        assert!(NvmeStatus::INVALID_OPCODE.to_string().contains("invalid command opcode"));
        assert_eq!(NvmeStatus::from_field(0x7ff).status_type(), StatusType::Other(7));
    }
}
