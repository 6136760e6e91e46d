//! The Python package `strata` (module `strata._strata`): [`store::StrataStore`], a class with the method
//! names, arguments and integer return codes of Mooncake's `MooncakeDistributedStore` for what Strata
//! supports, plus Strata's own operations (prefix match, pins, upsert, gather/scatter). Every call releases
//! the GIL while it does I/O. Built with maturin as an abi3 wheel for CPython ≥ 3.11 (the first stable ABI
//! with the buffer protocol).
#![deny(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

mod buffers;
mod codes;
mod events;
mod pool;
mod progressive;
mod store;

use pyo3::prelude::*;

/// The native module; `strata/__init__.py` re-exports it.
#[pymodule]
fn _strata(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_class::<store::StrataStore>()?;
    module.add_class::<events::EventSubscription>()?;
    module.add_class::<progressive::ProgressivePut>()?;
    for (name, code) in codes::ALL {
        module.add(name, code)?;
    }
    Ok(())
}
