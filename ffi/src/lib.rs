//! `strata-ffi`: bindgen bindings to native libraries (SPDK) behind features, and the client's C
//! ABI.
//!
//! Empty until a native binding is needed. See `ARCHITECTURE.md`.
#![deny(missing_docs, unsafe_code)]
