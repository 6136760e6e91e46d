//! The target's rules, from the wire: allow-lists, discovery per host, malformed PDUs answered with a
//! C2HTermReq without disturbing other connections, connections that connect no queue in time closed,
//! unknown opcodes, keep-alive expiry, honest SMART counters, queues on several cores, and the host
//! reconnecting after the target comes back.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use glommio::{LocalExecutorBuilder, Placement};
use strata_nvme::spec::{
    AdminOpcode, Command, Completion, ConnectData, DISCOVERY_NQN, FABRICS_OPCODE, FabricsType, NvmeStatus,
};
use strata_nvme::target::{self, NamespaceBackend, NamespaceConfig, SubsystemConfig, TargetConfig, TargetHandle};
use strata_nvme::tcp::pdu::{
    Decoder, Digests, PduHeader, ReceivedHeader, decode_pdu, encode_data_digest, encode_header,
};
use strata_nvme::{BlockDevice, BlockErrorKind, HostOptions, NvmfAddress, NvmfDevice, NvmfError};

const OPEN: &str = "nqn.2026-12.io.strata:open";
const GUARDED: &str = "nqn.2026-12.io.strata:guarded";
const ALLOWED_HOST: &str = "nqn.2026-12.io.strata:host-allowed";

fn memory(bytes: u64) -> NamespaceConfig {
    NamespaceConfig { backend: NamespaceBackend::Memory { bytes }, block_bytes: 4096 }
}

fn start(listen: &str, cpus: Vec<usize>) -> TargetHandle {
    let subsystems = vec![
        SubsystemConfig { nqn: OPEN.into(), namespaces: vec![memory(16 << 20)], allowed_hosts: Vec::new() },
        SubsystemConfig {
            nqn: GUARDED.into(),
            namespaces: vec![memory(16 << 20)],
            allowed_hosts: vec![ALLOWED_HOST.into()],
        },
    ];
    target::start(TargetConfig { cpus, ..TargetConfig::new(listen.parse().unwrap(), subsystems) }).unwrap()
}

fn on_executor<T: Send + 'static, F: Future<Output = T> + 'static>(make: impl FnOnce() -> F + Send + 'static) -> T {
    LocalExecutorBuilder::new(Placement::Unbound).spawn(make).unwrap().join().unwrap()
}

/// A deliberately simple blocking NVMe/TCP host, to put exact bytes on the wire.
struct RawHost {
    stream: TcpStream,
    decoder: Decoder,
    pending: Vec<u8>,
}

impl RawHost {
    fn connect(addr: SocketAddr) -> Self {
        Self::connect_with(addr, Digests::default())
    }

    fn connect_with(addr: SocketAddr, digests: Digests) -> Self {
        let stream = TcpStream::connect(addr).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let decoder = Decoder { controller: false, digests: Digests::default(), max_data_bytes: 1 << 20 };
        let mut host = Self { stream, decoder, pending: Vec::new() };
        host.send(&PduHeader::InitRequest { pfv: 0, hpda: 0, digests, maxr2t: 0 }, &[]);
        assert!(matches!(host.receive().unwrap().0.header, PduHeader::InitResponse { .. }));
        host.decoder.digests = digests;
        host
    }

    fn send(&mut self, header: &PduHeader, data: &[u8]) {
        let bytes = self.encode(header, data);
        self.stream.write_all(&bytes).unwrap();
    }

    /// A whole PDU as this connection's digests want it.
    fn encode(&self, header: &PduHeader, data: &[u8]) -> Vec<u8> {
        let mut bytes = Vec::new();
        encode_header(&mut bytes, header, self.decoder.digests, data.len() as u32, 4);
        bytes.extend_from_slice(data);
        encode_data_digest(&mut bytes, header, self.decoder.digests, data);
        bytes
    }

    /// The next PDU and its data; `None` when the target closed the connection.
    fn receive(&mut self) -> Option<(ReceivedHeader, Vec<u8>)> {
        loop {
            if let Ok((header, data, used)) = decode_pdu(&self.decoder, &self.pending) {
                let result = (header, data.to_vec());
                self.pending.drain(..used);
                return Some(result);
            }
            let mut chunk = [0u8; 65536];
            match self.stream.read(&mut chunk) {
                Ok(0) | Err(_) => return None,
                Ok(read) => self.pending.extend_from_slice(&chunk[..read]),
            }
        }
    }

    /// Sends a command and returns its completion and any data before it.
    fn command(&mut self, command: Command, data: &[u8]) -> (Completion, Vec<u8>) {
        self.send(&PduHeader::Command(command), data);
        let mut received = Vec::new();
        loop {
            let (header, data) = self.receive().expect("the target closed the connection");
            match header.header {
                PduHeader::ControllerData { success, .. } => {
                    received.extend_from_slice(&data);
                    if success {
                        return (Completion::new(command.cid, NvmeStatus::SUCCESS), received);
                    }
                }
                PduHeader::Response(completion) => return (completion, received),
                other => panic!("unexpected {other:?}"),
            }
        }
    }

    fn connect_admin(&mut self, subnqn: &str, hostnqn: &str, kato_ms: u32) -> Completion {
        let mut command = Command::new(FABRICS_OPCODE, 1);
        command.nsid = FabricsType::Connect as u32;
        command.sgl = strata_nvme::spec::SglDescriptor::in_capsule(1024);
        command.set_cdw(11, 31);
        command.set_cdw(12, kato_ms);
        let data = ConnectData { host_id: [1; 16], cntlid: 0xffff, subnqn: subnqn.into(), hostnqn: hostnqn.into() };
        self.command(command, &data.encode()).0
    }
}

#[test]
fn allow_lists_and_discovery_follow_the_host_nqn() {
    let target = start("127.0.0.1:0", vec![0]);
    let addr = target.local_addr();
    on_executor(move || async move {
        let stranger = HostOptions { hostnqn: "nqn.2026-12.io.strata:stranger".into(), ..HostOptions::default() };
        let guarded = NvmfAddress::tcp(addr, GUARDED, 1);
        match NvmfDevice::connect(&guarded, &stranger, 1).await {
            Err(NvmfError::Status { status, .. }) => assert_eq!(status, NvmeStatus::CONNECT_INVALID_HOST.with_dnr()),
            other => panic!("a host off the allow-list connected: {:?}", other.map(|device| device.name().to_string())),
        }
        let friend = HostOptions { hostnqn: ALLOWED_HOST.into(), ..HostOptions::default() };
        let device = NvmfDevice::connect(&guarded, &friend, 1).await.unwrap();
        assert_eq!(device.geometry().capacity_bytes, 16 << 20);

        let listed = |log: strata_nvme::spec::DiscoveryLog| {
            log.entries.into_iter().map(|entry| entry.subnqn).collect::<Vec<_>>()
        };
        let seen_by_stranger = listed(strata_nvme::host::discover(addr, &stranger).await.unwrap());
        assert_eq!(seen_by_stranger, vec![OPEN.to_string(), DISCOVERY_NQN.to_string()]);
        let seen_by_friend = listed(strata_nvme::host::discover(addr, &friend).await.unwrap());
        assert_eq!(seen_by_friend, vec![OPEN.to_string(), GUARDED.to_string(), DISCOVERY_NQN.to_string()]);

        let missing = NvmfAddress::tcp(addr, "nqn.2026-12.io.strata:nobody", 1);
        let error = NvmfDevice::connect(&missing, &friend, 1).await.err().unwrap();
        assert!(
            matches!(error, NvmfError::Status { status, .. } if status == NvmeStatus::CONNECT_INVALID_PARAMETERS.with_dnr())
        );
    });
    target.stop();
}

#[test]
fn a_malformed_pdu_ends_only_its_own_connection() {
    let target = start("127.0.0.1:0", vec![0]);
    let addr = target.local_addr();
    let (ready, go) = std::sync::mpsc::channel::<()>();
    let (done, finished) = std::sync::mpsc::channel::<()>();
    let healthy = std::thread::spawn(move || {
        on_executor(move || async move {
            let address = NvmfAddress::tcp(addr, OPEN, 1);
            let device = NvmfDevice::connect(&address, &HostOptions::default(), 1).await.unwrap();
            let mut buffer = device.alloc_buffer(4096);
            buffer.as_mut_slice().fill(0x3c);
            device.write(buffer, 0).await.1.unwrap();
            ready.send(()).unwrap();
            // Wait while the other connection misbehaves, then prove this one still works.
            while finished.try_recv().is_err() {
                glommio::timer::sleep(Duration::from_millis(5)).await;
            }
            let (buffer, result) = device.read(device.alloc_buffer(4096), 0).await;
            result.unwrap();
            assert!(buffer.as_slice().iter().all(|&byte| byte == 0x3c));
        })
    });
    go.recv().unwrap();

    // An unknown PDU type: C2HTermReq, Invalid PDU Header Field at byte 0, and the connection closes.
    let mut rogue = RawHost::connect(addr);
    let mut garbage = vec![0x42u8, 0, 24, 0, 24, 0, 0, 0];
    garbage.resize(24, 0xee);
    rogue.stream.write_all(&garbage).unwrap();
    let (header, echoed) = rogue.receive().expect("a C2HTermReq");
    assert_eq!(header.header, PduHeader::TermRequest { from_host: false, fes: 0x01, fei: 0 });
    assert_eq!(&echoed[..8], &garbage[..8], "the TermReq carries the offending header");
    assert!(rogue.receive().is_none(), "the target closes the connection after a C2HTermReq");

    // A hostile length: PLEN claims 4 GiB of in-capsule data.
    let mut liar = RawHost::connect(addr);
    let mut capsule = Vec::new();
    encode_header(&mut capsule, &PduHeader::Command(Command::new(1, 1)), Digests::default(), 64, 4);
    capsule[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
    liar.stream.write_all(&capsule).unwrap();
    let (header, _) = liar.receive().expect("a C2HTermReq");
    assert!(matches!(header.header, PduHeader::TermRequest { fes: 0x05, .. }), "{:?}", header.header);
    assert!(liar.receive().is_none());

    done.send(()).unwrap();
    healthy.join().unwrap();
    target.stop();
}

#[test]
fn a_bad_data_digest_fails_its_command_with_a_transient_transport_error_and_keeps_the_connection() {
    let target = start("127.0.0.1:0", vec![0]);
    let mut host = RawHost::connect_with(target.local_addr(), Digests { header: false, data: true });
    let mut command = Command::new(FABRICS_OPCODE, 7);
    command.nsid = FabricsType::Connect as u32;
    command.sgl = strata_nvme::spec::SglDescriptor::in_capsule(1024);
    command.set_cdw(11, 31);
    let data = ConnectData {
        host_id: [1; 16],
        cntlid: 0xffff,
        subnqn: OPEN.into(),
        hostnqn: "nqn.2026-12.io.strata:digest".into(),
    }
    .encode();
    let mut capsule = host.encode(&PduHeader::Command(command), &data);
    let last = capsule.len() - 1;
    capsule[last] ^= 0x01;
    host.stream.write_all(&capsule).unwrap();
    let (header, _) = host.receive().expect("a response, not a closed connection");
    let PduHeader::Response(completion) = header.header else {
        panic!("a bad data digest must not end the connection with {:?}", header.header)
    };
    assert_eq!((completion.cid, completion.status), (7, NvmeStatus::TRANSIENT_TRANSPORT_ERROR));
    let (completion, _) = host.command(Command { cid: 8, ..command }, &data);
    assert!(
        completion.status.is_success(),
        "the same connection connects once the data is intact: {}",
        completion.status
    );
    target.stop();
}

#[test]
fn a_connection_that_connects_no_queue_in_time_is_closed_and_one_that_did_stays() {
    let subsystems =
        vec![SubsystemConfig { nqn: OPEN.into(), namespaces: vec![memory(1 << 20)], allowed_hosts: Vec::new() }];
    let timeout = Duration::from_millis(300);
    let config =
        TargetConfig { handshake_timeout: timeout, ..TargetConfig::new("127.0.0.1:0".parse().unwrap(), subsystems) };
    let target = target::start(config).unwrap();
    let addr = target.local_addr();
    let accepted = Instant::now();
    let mut silent = TcpStream::connect(addr).unwrap();
    silent.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut initialized = RawHost::connect(addr);
    let mut connected = RawHost::connect(addr);
    assert_eq!(connected.connect_admin(OPEN, ALLOWED_HOST, 0).status, NvmeStatus::SUCCESS);
    // Not even ICReq: closed once the timeout passed, not before and not much after.
    assert_eq!(silent.read(&mut [0u8; 1]).unwrap(), 0, "the target closed a silent connection");
    let took = accepted.elapsed();
    assert!(took >= timeout && took < timeout * 10, "closed after {took:?}");
    // ICReq answered, then no Connect: closed too.
    assert!(initialized.receive().is_none(), "a connection with no queue connected is closed");
    // A queue connected in time keeps serving after the timeout.
    let mut keep_alive = Command::new(AdminOpcode::KeepAlive as u8, 2);
    keep_alive.nsid = 0;
    assert_eq!(connected.command(keep_alive, &[]).0.status, NvmeStatus::SUCCESS);
    target.stop();
}

#[test]
fn unknown_opcodes_get_their_status_and_keep_alive_expiry_tears_the_controller_down() {
    let target = start("127.0.0.1:0", vec![0]);
    let mut host = RawHost::connect(target.local_addr());
    let completion = host.connect_admin(OPEN, "nqn.2026-12.io.strata:raw", 300);
    assert!(completion.status.is_success(), "{}", completion.status);
    let (completion, _) = host.command(Command::new(0xc5, 2), &[]);
    assert_eq!(completion.status, NvmeStatus::INVALID_OPCODE.with_dnr());
    let mut identify = Command::new(AdminOpcode::Identify as u8, 3);
    identify.set_cdw(10, 0x01);
    identify.sgl = strata_nvme::spec::SglDescriptor::transport(4096);
    let (completion, data) = host.command(identify, &[]);
    assert!(completion.status.is_success());
    let identity = strata_nvme::spec::ControllerIdentity::decode(&data).unwrap();
    assert_eq!(identity.subnqn, OPEN);
    assert_eq!(identity.kas, 1);

    // No Keep Alive within the 300 ms KATO: the target tears the controller down and closes the queue.
    let started = Instant::now();
    assert!(host.receive().is_none());
    let waited = started.elapsed();
    assert!(waited >= Duration::from_millis(250) && waited < Duration::from_secs(5), "closed after {waited:?}");
    target.stop();
}

#[test]
fn smart_counts_what_the_hosts_did() {
    let target = start("127.0.0.1:0", vec![0]);
    let addr = target.local_addr();
    let writes = 37u64;
    on_executor(move || async move {
        let address = NvmfAddress::tcp(addr, OPEN, 1);
        let device = NvmfDevice::connect(&address, &HostOptions::default(), 1).await.unwrap();
        for index in 0..writes {
            device.write(device.alloc_buffer(8192), index * 8192).await.1.unwrap();
        }
        let error = device.read(device.alloc_buffer(4096), 16 << 20).await.1.unwrap_err();
        assert!(matches!(error.kind, BlockErrorKind::OutOfRange { .. }), "checked before it is sent: {error}");
    });
    let mut host = RawHost::connect(addr);
    assert!(host.connect_admin(OPEN, "nqn.2026-12.io.strata:raw", 0).status.is_success());
    let mut log = Command::new(AdminOpcode::GetLogPage as u8, 2);
    log.nsid = u32::MAX;
    log.set_cdw(10, 0x02 | ((512 / 4 - 1) << 16));
    log.sgl = strata_nvme::spec::SglDescriptor::transport(512);
    let (completion, smart) = host.command(log, &[]);
    assert!(completion.status.is_success());
    let counter = |at: usize| u64::from_le_bytes(smart[at..at + 8].try_into().unwrap());
    assert_eq!(counter(80), writes, "host write commands");
    assert_eq!(counter(48), (writes * 8192 / 512).div_ceil(1000), "data units written");
    assert_eq!(smart[3], 100, "available spare");
    target.stop();
}

#[test]
fn queues_on_two_cores_share_one_controller_and_the_host_reconnects() {
    let target = start("127.0.0.1:0", vec![0, 1]);
    let addr = target.local_addr();
    let options = HostOptions { reconnect_delay: Duration::from_millis(50), ..HostOptions::default() };
    let address = NvmfAddress::tcp(addr, OPEN, 1);
    let (handle_out, handle_in) = std::sync::mpsc::channel();
    let (restarted_out, restarted_in) = std::sync::mpsc::channel::<()>();
    let (stopped_out, stopped_in) = std::sync::mpsc::channel::<()>();
    let owner = {
        let (address, options) = (address.clone(), options.clone());
        std::thread::spawn(move || {
            on_executor(move || async move {
                let device = NvmfDevice::connect(&address, &options, 2).await.unwrap();
                assert_eq!(device.controller().unwrap().io_queues, 2);
                let mut buffer = device.alloc_buffer(4096);
                buffer.as_mut_slice().fill(9);
                device.write(buffer, 4096).await.1.unwrap();
                // Only once the write is acknowledged may the second queue read it back.
                handle_out.send(device.io_queue_handle()).unwrap();
                // The target goes away and comes back empty on the same port; the next I/O reconnects.
                stopped_in.recv().unwrap();
                while restarted_in.try_recv().is_err() {
                    glommio::timer::sleep(Duration::from_millis(10)).await;
                }
                let (buffer, result) = device.read(device.alloc_buffer(4096), 4096).await;
                if result.is_err() {
                    // The command in flight when the connection broke fails; the retry reconnects.
                    let (buffer, result) = device.read(buffer, 4096).await;
                    result.unwrap();
                    assert!(buffer.as_slice().iter().all(|&byte| byte == 0), "a fresh RAM namespace");
                } else {
                    assert!(buffer.as_slice().iter().all(|&byte| byte == 0), "a fresh RAM namespace");
                }
            })
        })
    };
    let handle = handle_in.recv().unwrap();
    on_executor(move || async move {
        let second = NvmfDevice::attach(&handle).await.unwrap();
        let (buffer, result) = second.read(second.alloc_buffer(4096), 4096).await;
        result.unwrap();
        assert!(buffer.as_slice().iter().all(|&byte| byte == 9), "both queues see one namespace");
        assert!(NvmfDevice::attach(&handle).await.is_err(), "a third queue was not granted");
    });
    target.stop();
    stopped_out.send(()).unwrap();
    let again = start(&addr.to_string(), vec![0]);
    restarted_out.send(()).unwrap();
    owner.join().unwrap();
    again.stop();
}
