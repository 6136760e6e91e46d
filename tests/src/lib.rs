//! Integration tests that cross crates live in `tests/`; this library is empty.
#![deny(missing_docs)]
