//! The NVMe/TCP transport: the PDU codec ([`pdu`]) and the framing of PDUs on a glommio TCP stream
//! ([`stream`]), shared by the target and the host.

pub mod pdu;
pub mod stream;

pub use pdu::{Decoder, Digests, FatalError, PduError, PduHeader, PduType, ReceivedHeader};
pub use stream::{
    Outbox, PduReader, PduWriter, Socket, TransportError, send_without_waiting, set_congestion_control, split_polled,
    split_stream,
};
