//! `--rdma-device` is checked when the node starts: a build without feature `rdma` says which feature it
//! lacks, and a device that is not there is named with the devices there are; so is the NVMe-oF target's RDMA
//! listener. None needs RDMA hardware.

mod common;

use common::config;

#[test]
fn a_node_asked_for_rdma_it_cannot_have_refuses_to_start() {
    let mut config = config(&[0], 16 << 20);
    config.rdma_device = Some("strata-no-such-device".into());
    let error = strata_engine::start(config).err().expect("the node refuses to start").to_string();
    if cfg!(feature = "rdma") {
        assert!(error.contains("RDMA device"), "names the device problem: {error}");
    } else {
        assert!(error.contains("--features rdma"), "names the feature: {error}");
    }
}

/// The same for the NVMe-oF target's RDMA listener: without feature `rdma` it names the feature; with it,
/// an address no RDMA device owns (here, where there is none, any address) is refused with RDMA_CM's error.
#[test]
fn a_target_asked_to_listen_on_rdma_it_cannot_have_refuses_to_start() {
    use strata_nvme::target::{self, NamespaceBackend, NamespaceConfig, SubsystemConfig, TargetConfig};
    let namespace = NamespaceConfig { backend: NamespaceBackend::Memory { bytes: 1 << 20 }, block_bytes: 4096 };
    let subsystem =
        SubsystemConfig { nqn: "nqn.2026-12.io.strata:t".into(), namespaces: vec![namespace], allowed_hosts: vec![] };
    let config = TargetConfig {
        rdma_listen: Some("192.0.2.1:4420".parse().unwrap()),
        ..TargetConfig::new("127.0.0.1:0".parse().unwrap(), vec![subsystem])
    };
    let error = target::start(config).err().expect("the target refuses to start").to_string();
    if cfg!(feature = "rdma") {
        assert!(error.contains("RDMA_CM"), "names the listener's problem: {error}");
    } else {
        assert!(error.contains("--features rdma"), "names the feature: {error}");
    }
}

/// And for the NVMe-oF host: `trtype=rdma` without feature `rdma` names the feature; with it, where no RDMA
/// device routes to the address, the connect fails with the connection manager's error, at once.
#[test]
fn a_host_asked_for_rdma_it_cannot_have_fails_with_a_typed_error() {
    let address = strata_nvme::NvmfAddress::parse("trtype=rdma,traddr=192.0.2.1,trsvcid=4420,subnqn=nqn.x").unwrap();
    let error = glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
        .spawn(move || async move {
            let options = strata_nvme::HostOptions::default();
            strata_nvme::NvmfDevice::connect(&address, &options, 1).await.err().expect("no RDMA to connect over")
        })
        .expect("executor")
        .join()
        .expect("the connect's outcome");
    assert!(matches!(error, strata_nvme::NvmfError::Rdma(_)), "{error}");
    if !cfg!(feature = "rdma") {
        assert!(error.to_string().contains("--features rdma"), "names the feature: {error}");
    }
}
