//! The test kit the tools and the test suite share: mock external APIs that
//! count every request and effect (also served by `idem mock-api`), private
//! Redis and NATS servers that can be killed and restarted, and a TCP proxy
//! that partitions the network.

pub mod mock;
pub mod mock_api;
mod nats;
mod proxy;
mod redis;

pub use mock::{Counts, Mock};
pub use nats::OwnNats;
pub use proxy::{FaultyProxy, Link};
pub use redis::OwnRedis;
