//! The directories of `file:` namespaces. A missing one is refused rather than created: a typo in a path
//! would otherwise put a namespace, and the data written to it, where nobody looks for it. Creation is
//! asked for explicitly (`--create-dirs`), or implied by the node's embedded default.

use anyhow::bail;
use strata_nvme::DeviceSpec;

/// Checks that the directory holding a `file:` namespace exists, creating it when `create` is set; other
/// namespaces pass unchecked.
pub fn ensure_parent_dir(spec: &DeviceSpec, create: bool) -> anyhow::Result<()> {
    let DeviceSpec::File { path, .. } = spec else { return Ok(()) };
    let Some(parent) = path.parent().filter(|parent| !parent.as_os_str().is_empty()) else { return Ok(()) };
    if parent.is_dir() {
        return Ok(());
    }
    if parent.exists() {
        bail!("file:{}: {} is not a directory", path.display(), parent.display());
    }
    if !create {
        bail!(
            "file:{}: directory {} does not exist; create it, or pass --create-dirs to have it created",
            path.display(),
            parent.display()
        );
    }
    std::fs::create_dir_all(parent).map_err(|error| anyhow::anyhow!("creating {}: {error}", parent.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file_spec(path: &std::path::Path) -> DeviceSpec {
        DeviceSpec::parse(&format!("file:{},size=1MiB", path.display()), |_| Some(1 << 20)).expect("spec")
    }

    #[test]
    fn a_missing_directory_is_refused_with_its_name_unless_creation_is_asked() {
        let root = std::env::temp_dir().join(format!("strata-file-dirs-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let spec = file_spec(&root.join("missing/ns.img"));
        let error = ensure_parent_dir(&spec, false).expect_err("refused").to_string();
        assert!(error.contains(&root.join("missing").display().to_string()), "{error}");
        assert!(error.contains("--create-dirs"), "{error}");
        assert!(!root.exists(), "nothing was created");
        ensure_parent_dir(&spec, true).expect("created");
        assert!(root.join("missing").is_dir());
        ensure_parent_dir(&spec, false).expect("an existing directory passes");
        std::fs::remove_dir_all(&root).expect("cleanup");
    }

    #[test]
    fn a_parent_that_is_a_file_is_refused_even_with_creation() {
        let root = std::env::temp_dir().join(format!("strata-file-dirs-file-{}", std::process::id()));
        std::fs::write(&root, b"x").expect("file");
        let error = ensure_parent_dir(&file_spec(&root.join("ns.img")), true).expect_err("refused").to_string();
        assert!(error.contains("not a directory"), "{error}");
        std::fs::remove_file(&root).expect("cleanup");
    }
}
