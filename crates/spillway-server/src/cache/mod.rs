//! Cache instances (issue 18; design in docs/cache.md). Built one step at a time, ahead
//! of the requests that will use it; nothing here is reachable from the service yet.
//!
//! * `wblog`  — the write-behind log: which ranges of which stripes are dirty (written
//!   here, not yet on the PFS), kept so that a server restart resumes write-behind.
//! * `ranges` — sets of byte ranges (a stripe's dirty ranges).

pub(crate) mod ranges;
pub(crate) mod wblog;
