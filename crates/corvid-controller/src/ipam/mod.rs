//! The controller's address management: pool and prefix arithmetic (`pools`), the
//! reservations and cursors of requests in flight (`allocator`), and a port's addresses
//! and MAC resolved against the view into store operations (`fixed_ips`).

pub mod allocator;
pub mod fixed_ips;
pub mod pools;

pub use allocator::{Allocator, Pending};
