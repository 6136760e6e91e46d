//! `etcd://HOST:PORT[,HOST:PORT…]`, as `--cluster`, `Client::connect_cluster` and the Python `setup`'s
//! `metadata_server` take it, into etcd-client's endpoints.

/// A cluster address that is not `etcd://HOST:PORT[,HOST:PORT…]`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{given:?}: give etcd://HOST:PORT[,HOST:PORT…]")]
pub struct EndpointsError {
    /// The address given.
    pub given: String,
}

/// The etcd client endpoints (`http://HOST:PORT`) that `url` names.
pub fn etcd_endpoints(url: &str) -> Result<Vec<String>, EndpointsError> {
    let error = || EndpointsError { given: url.to_string() };
    let hosts = url.strip_prefix("etcd://").ok_or_else(error)?;
    let hosts: Vec<&str> = hosts.split(',').map(str::trim).collect();
    if hosts.iter().any(|host| host.is_empty() || host.contains('/')) {
        return Err(error());
    }
    Ok(hosts.iter().map(|host| format!("http://{host}")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_name_endpoints() {
        assert_eq!(etcd_endpoints("etcd://127.0.0.1:2379").unwrap(), ["http://127.0.0.1:2379"]);
        assert_eq!(etcd_endpoints("etcd://a:1, b:2").unwrap(), ["http://a:1", "http://b:2"]);
        for bad in ["127.0.0.1:2379", "etcd://", "etcd://a:1,", "http://a:1", "etcd://a:1/x"] {
            assert!(etcd_endpoints(bad).is_err(), "{bad}");
        }
    }
}
