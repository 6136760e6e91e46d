//! A real etcd (Debian's etcd-server) on loopback ports with a scratch data directory, for the cluster
//! tests; its members are those of cluster `test`.
#![allow(dead_code)]

use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use strata_cluster::Member;

const ETCD: &str = "/usr/bin/etcd";

/// A free loopback port.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|listener| listener.local_addr()).expect("a free port").port()
}

/// An etcd server, killed when dropped.
pub struct Etcd {
    child: Child,
    /// Its client port.
    pub client_port: u16,
    /// Its peer port.
    pub peer_port: u16,
}

impl Etcd {
    pub fn start(data: &Path, client_port: u16, peer_port: u16) -> Etcd {
        Self::start_on(data, "127.0.0.1", client_port, peer_port)
    }

    /// etcd answering clients on loopback and on `address` too (an address of a network namespace the
    /// test made, for nodes in other namespaces).
    pub fn start_on(data: &Path, address: &str, client_port: u16, peer_port: u16) -> Etcd {
        assert!(Path::new(ETCD).exists(), "{ETCD} is missing: install Debian's etcd-server (scripts/test.sh does)");
        let client = format!("http://{address}:{client_port}");
        let listen =
            if address == "127.0.0.1" { client.clone() } else { format!("http://127.0.0.1:{client_port},{client}") };
        let peer = format!("http://127.0.0.1:{peer_port}");
        let child = Command::new(ETCD)
            .args(["--name", "default", "--data-dir"])
            .arg(data)
            .args(["--listen-client-urls", &listen, "--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer, "--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &format!("default={peer}")])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("etcd starts");
        let etcd = Etcd { child, client_port, peer_port };
        etcd.members(Duration::from_secs(20));
        etcd
    }

    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// The cluster's members as etcd holds them; retries for `patience` while etcd does not answer.
    pub fn members(&self, patience: Duration) -> Vec<Member> {
        let endpoint = format!("http://127.0.0.1:{}", self.client_port);
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        let deadline = Instant::now() + patience;
        loop {
            let answer = runtime.block_on(async {
                let mut client = etcd_client::Client::connect([endpoint.as_str()], None).await?;
                let options = etcd_client::GetOptions::new().with_prefix();
                client.get(strata_cluster::members_prefix("test"), Some(options)).await
            });
            match answer {
                Ok(answer) => {
                    return answer
                        .kvs()
                        .iter()
                        .map(|kv| serde_json::from_slice(kv.value()).expect("a member entry is JSON"))
                        .collect();
                }
                Err(error) => assert!(Instant::now() < deadline, "etcd does not answer: {error}"),
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits (at most `limit`) until the member ids are `ids`; returns the members and how long it took.
    pub fn wait_for(&self, ids: &[&str], limit: Duration) -> (Vec<Member>, Duration) {
        let started = Instant::now();
        loop {
            let members = self.members(limit);
            let mut present: Vec<&str> = members.iter().map(|member| member.id.as_str()).collect();
            present.sort_unstable();
            if present == ids {
                return (members, started.elapsed());
            }
            assert!(started.elapsed() < limit, "members {present:?}, waited for {ids:?}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.stop();
    }
}
