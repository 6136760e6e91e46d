//! `--rdma-device` is checked when the node starts: a build without feature `rdma` says which feature it
//! lacks, and a device that is not there is named with the devices there are. Neither needs RDMA hardware.

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
