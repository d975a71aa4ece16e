//! The test kit the tools and the test suite share: mock external APIs that
//! count every request and effect (also served by `idem mock-api`), and a
//! private Redis server that can be killed and restarted.

pub mod mock;
pub mod mock_api;
mod redis;

pub use mock::{Counts, Mock};
pub use redis::OwnRedis;
