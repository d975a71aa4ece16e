//! What one instance of a component takes from the pooling allocator, and
//! the capacity an execution reserves before it instantiates.
//!
//! A small Rust component is one or two core instances and one memory; a
//! component with a language runtime inside (CPython, SpiderMonkey) holds
//! dozens of core instances and several memories and tables. The pool is
//! sized from the components the configuration loads ([`Footprint::of`]),
//! and every execution reserves its component's footprint from
//! [`Capacity`] first: when the pool is full an execution waits for room,
//! it never fails for a host-side limit, so a message never spends an
//! attempt (or is dead-lettered) because the host was busy.

use std::sync::Arc;

use anyhow::{Context, Result};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use wasmparser::{Instance, Parser, Payload};

/// The most core instances, memories or tables one component may make (a
/// CPython component makes a few dozen).
pub const MOST_PER_COMPONENT: u32 = 10_000;

/// Pool slots one instance of a component takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Footprint {
    /// Core module instantiations.
    pub core_instances: u32,
    /// Linear memories defined by its modules.
    pub memories: u32,
    /// Tables defined by its modules.
    pub tables: u32,
    /// The starting sizes of the memories it defines, added up, in bytes:
    /// what an instance needs of `limits.memory_bytes` (one budget for all
    /// its memories) before it runs.
    pub starting_memory: u64,
    /// The largest of those starting sizes: what one memory needs of the
    /// pool's slot.
    pub largest_memory: u64,
}

impl Footprint {
    /// What a small Rust component needs, with room to spare: the least
    /// the pool is sized for.
    pub const SMALL: Footprint = Footprint {
        core_instances: 4,
        memories: 2,
        tables: 4,
        starting_memory: 0,
        largest_memory: 0,
    };

    /// Count what a component binary instantiates: core instances made by
    /// instantiating a module, and the memories and tables its modules
    /// define (imported ones are shared, not allocated). Each item is read,
    /// not taken from a section's count (which a malformed binary can set to
    /// anything), and more than [`MOST_PER_COMPONENT`] of any is refused.
    pub fn of(component: &[u8]) -> Result<Footprint> {
        let mut fp = Footprint {
            core_instances: 0,
            memories: 0,
            tables: 0,
            starting_memory: 0,
            largest_memory: 0,
        };
        for payload in Parser::new(0).parse_all(component) {
            match payload.context("its sections cannot be read")? {
                Payload::InstanceSection(reader) => {
                    for instance in reader {
                        if let Instance::Instantiate { .. } = instance? {
                            fp.core_instances += 1;
                        }
                    }
                }
                Payload::MemorySection(reader) => {
                    for memory in reader {
                        let memory = memory?;
                        let page = 1u64.checked_shl(memory.page_size_log2.unwrap_or(16)).unwrap_or(u64::MAX);
                        let bytes = memory.initial.saturating_mul(page);
                        fp.starting_memory = fp.starting_memory.saturating_add(bytes);
                        fp.largest_memory = fp.largest_memory.max(bytes);
                        fp.memories += 1;
                    }
                }
                Payload::TableSection(reader) => {
                    for table in reader {
                        table?;
                        fp.tables += 1;
                    }
                }
                _ => {}
            }
            if fp.core_instances.max(fp.memories).max(fp.tables) > MOST_PER_COMPONENT {
                anyhow::bail!(
                    "it makes more than {MOST_PER_COMPONENT} core instances, memories or tables: more than an instance pool holds"
                );
            }
        }
        // A core module on its own (not a component) is one instance.
        fp.core_instances = fp.core_instances.max(1);
        Ok(fp)
    }

    /// The larger of each count (and starting memory).
    pub fn max(self, other: Footprint) -> Footprint {
        Footprint {
            core_instances: self.core_instances.max(other.core_instances),
            memories: self.memories.max(other.memories),
            tables: self.tables.max(other.tables),
            starting_memory: self.starting_memory.max(other.starting_memory),
            largest_memory: self.largest_memory.max(other.largest_memory),
        }
    }

    /// Whether every count is within `limit`'s.
    pub fn fits(self, limit: Footprint) -> bool {
        self.core_instances <= limit.core_instances && self.memories <= limit.memories && self.tables <= limit.tables
    }
}

/// The pool's slots, as semaphores: an execution holds its component's
/// footprint while its instance lives.
pub struct Capacity {
    core_instances: Arc<Semaphore>,
    memories: Arc<Semaphore>,
    tables: Arc<Semaphore>,
}

/// Slots held by one execution; released when dropped.
pub struct Reserved {
    _held: [OwnedSemaphorePermit; 3],
}

impl Capacity {
    /// A pool of `instances` instances of `per_instance` each.
    pub fn new(instances: u32, per_instance: Footprint) -> Self {
        let n = |per: u32| Arc::new(Semaphore::new((instances * per) as usize));
        Capacity {
            core_instances: n(per_instance.core_instances),
            memories: n(per_instance.memories),
            tables: n(per_instance.tables),
        }
    }

    /// Wait until `fp` fits, then hold it.
    pub async fn reserve(&self, fp: Footprint) -> Reserved {
        let take = |s: &Arc<Semaphore>, n: u32| s.clone().acquire_many_owned(n);
        // Always in the same order, so two executions never hold a part each.
        let a = take(&self.core_instances, fp.core_instances).await.expect("never closed");
        let b = take(&self.memories, fp.memories).await.expect("never closed");
        let c = take(&self.tables, fp.tables).await.expect("never closed");
        Reserved { _held: [a, b, c] }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_core_module_is_one_instance_with_its_memories_and_tables() {
        // (module (table 1 funcref) (memory 1) (memory 1)) in binary.
        let wasm = b"\0asm\x01\0\0\0\x04\x04\x01\x70\x00\x01\x05\x05\x02\x00\x01\x00\x01";
        let fp = Footprint::of(wasm).unwrap();
        assert_eq!(
            fp,
            Footprint {
                core_instances: 1,
                memories: 2,
                tables: 1,
                starting_memory: 2 << 16,
                largest_memory: 1 << 16,
            }
        );
        assert!(fp.fits(Footprint::SMALL));
        assert!(Footprint::of(b"not wasm").is_err());
    }

    /// A section's count is not trusted: a memory section claiming 2^32 - 1
    /// memories in five bytes was counted as that many, and overflowed the
    /// pool's sizing. Too many real ones are refused too.
    #[test]
    fn counts_are_read_item_by_item_and_bounded() {
        assert!(Footprint::of(b"\0asm\x01\0\0\0\x05\x05\xff\xff\xff\xff\x0f").is_err());
        // 10,001 memories of one page each, two bytes an entry.
        let n = MOST_PER_COMPONENT + 1;
        let mut section = vec![0x91, 0x4e]; // LEB128 of 10,001
        for _ in 0..n {
            section.extend([0x00, 0x01]);
        }
        let mut wasm = b"\0asm\x01\0\0\0\x05".to_vec();
        let mut len = section.len();
        while len >= 0x80 {
            wasm.push((len as u8 & 0x7f) | 0x80);
            len >>= 7;
        }
        wasm.push(len as u8);
        wasm.extend(section);
        let err = Footprint::of(&wasm).unwrap_err().to_string();
        assert!(err.contains("more than 10000"), "{err}");
    }

    #[tokio::test]
    async fn an_execution_waits_for_room_instead_of_failing() {
        let capacity = Capacity::new(
            1,
            Footprint {
                core_instances: 10,
                memories: 2,
                tables: 2,
                starting_memory: 0,
                largest_memory: 0,
            },
        );
        let big = Footprint {
            core_instances: 8,
            memories: 1,
            tables: 1,
            starting_memory: 0,
            largest_memory: 0,
        };
        let capacity = Arc::new(capacity);
        let first = capacity.reserve(big).await;
        assert_eq!(capacity.core_instances.available_permits(), 2, "no room for a second");
        let waiting = {
            let capacity = capacity.clone();
            tokio::spawn(async move { capacity.reserve(big).await })
        };
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "the second waits while the first lives");
        drop(first);
        let _second = waiting.await.unwrap();
        assert_eq!(capacity.core_instances.available_permits(), 2);
    }
}
