//! A look into guests' linear memory, for the tests that show no secret
//! ever reaches a connector.
//!
//! A server built in code with a [`GuestMemoryProbe`]'s memories in its
//! plugin settings runs its guests in memories the host allocates itself
//! ([`wasmtime::MemoryCreator`]). When an invocation ends and its store is
//! dropped, each of its memories is searched, whole, for the probe's
//! needles before it is freed: what a guest held at the end of a call,
//! copied from nowhere and asked of no guest. No setting, flag or variable
//! turns a probe on; only a harness that builds the configuration can.
//!
//! The probed engine has no pooling, no reservation and no guard pages, so
//! every access is bounds-checked in code and a memory may move when it
//! grows; the guest's limits (the store's limiter) are the same.

use std::alloc::Layout;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex};

use wasmtime::{LinearMemory, MemoryCreator, MemoryType};

/// Needles to look for in every guest memory at the end of its call, and
/// what was found.
pub struct GuestMemoryProbe {
    needles: Vec<Vec<u8>>,
    findings: Mutex<Findings>,
}

/// What the probe has searched and found so far.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Findings {
    /// Memories searched (one or more per invocation).
    pub memories: u64,
    /// Bytes searched, all memories together.
    pub bytes: u64,
    /// Occurrences of each needle, in the order they were given.
    pub hits: Vec<u64>,
}

impl GuestMemoryProbe {
    /// A probe looking for each of `needles`.
    pub fn watching<N: AsRef<[u8]>>(needles: impl IntoIterator<Item = N>) -> Arc<GuestMemoryProbe> {
        let needles: Vec<Vec<u8>> = needles.into_iter().map(|n| n.as_ref().to_vec()).collect();
        let hits = vec![0; needles.len()];
        Arc::new(GuestMemoryProbe { needles, findings: Mutex::new(Findings { hits, ..Findings::default() }) })
    }

    /// The allocator of guest memories that this probe searches, for
    /// `PluginSettings::guest_memories`.
    pub fn memories(self: &Arc<Self>) -> crate::config::GuestMemories {
        crate::config::GuestMemories(Arc::new(ProbedMemories(self.clone())))
    }

    /// What has been searched and found so far.
    pub fn findings(&self) -> Findings {
        self.findings.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn search(&self, memory: &[u8]) {
        let hits: Vec<u64> = self
            .needles
            .iter()
            .map(|needle| if needle.is_empty() { 0 } else { memchr::memmem::find_iter(memory, needle).count() as u64 })
            .collect();
        let mut findings = self.findings.lock().unwrap_or_else(|e| e.into_inner());
        findings.memories += 1;
        findings.bytes += memory.len() as u64;
        for (total, found) in findings.hits.iter_mut().zip(hits) {
            *total += found;
        }
    }
}

impl std::fmt::Debug for GuestMemoryProbe {
    /// The needles are what a test keeps secret: never printed.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GuestMemoryProbe").field("needles", &self.needles.len()).finish_non_exhaustive()
    }
}

/// Makes each guest memory a [`ProbedMemory`].
pub(crate) struct ProbedMemories(pub Arc<GuestMemoryProbe>);

// SAFETY: the memories made honour the engine's settings (no reservation,
// no guard region, free to move on growth; see `engine_config`) and are
// zero-filled.
unsafe impl MemoryCreator for ProbedMemories {
    fn new_memory(
        &self,
        _ty: MemoryType,
        minimum: usize,
        maximum: Option<usize>,
        reserved_size_in_bytes: Option<usize>,
        guard_size_in_bytes: usize,
    ) -> Result<Box<dyn LinearMemory>, String> {
        if reserved_size_in_bytes.unwrap_or(0) != 0 || guard_size_in_bytes != 0 {
            return Err("a probed guest memory needs an engine without reservations or guard regions".into());
        }
        let mut memory =
            ProbedMemory { base: NonNull::dangling(), capacity: 0, size: 0, maximum, probe: self.0.clone() };
        memory.grow_to(minimum).map_err(|e| e.to_string())?;
        Ok(Box::new(memory))
    }
}

/// Alignment of a probed memory's bytes (a page, as wasmtime's own).
const ALIGN: usize = 4096;

/// One guest's linear memory, allocated by the host and searched when
/// freed.
struct ProbedMemory {
    base: NonNull<u8>,
    /// Bytes allocated at `base` (zero: nothing allocated).
    capacity: usize,
    /// Bytes the guest may use.
    size: usize,
    maximum: Option<usize>,
    probe: Arc<GuestMemoryProbe>,
}

// SAFETY: the allocation is owned by this value alone; wasmtime serialises
// access to a memory through its store.
unsafe impl Send for ProbedMemory {}
// SAFETY: as above; `&self` methods only read the fields.
unsafe impl Sync for ProbedMemory {}

// SAFETY: `as_ptr` points at `capacity` zero-initialised or guest-written
// bytes, of which `size` are the guest's; growth moves them whole.
unsafe impl LinearMemory for ProbedMemory {
    fn byte_size(&self) -> usize {
        self.size
    }

    fn byte_capacity(&self) -> usize {
        self.capacity
    }

    fn grow_to(&mut self, new_size: usize) -> wasmtime::Result<()> {
        if self.maximum.is_some_and(|max| new_size > max) {
            wasmtime::bail!("a probed guest memory cannot grow past its maximum");
        }
        if new_size > self.capacity {
            let layout = Layout::from_size_align(new_size, ALIGN)?;
            // SAFETY: the layout is non-zero-sized (new_size > capacity >= 0
            // and new_size > 0 here) and aligned.
            let fresh = unsafe { std::alloc::alloc_zeroed(layout) };
            let Some(fresh) = NonNull::new(fresh) else {
                wasmtime::bail!("the host could not allocate {new_size} bytes for a probed guest memory");
            };
            if self.capacity > 0 {
                // SAFETY: both regions are live allocations of at least
                // `size` bytes and do not overlap.
                unsafe {
                    std::ptr::copy_nonoverlapping(self.base.as_ptr(), fresh.as_ptr(), self.size);
                    std::alloc::dealloc(self.base.as_ptr(), Layout::from_size_align_unchecked(self.capacity, ALIGN));
                }
            }
            self.base = fresh;
            self.capacity = new_size;
        }
        self.size = new_size;
        Ok(())
    }

    fn as_ptr(&self) -> *mut u8 {
        self.base.as_ptr()
    }
}

impl Drop for ProbedMemory {
    fn drop(&mut self) {
        if self.capacity == 0 {
            return;
        }
        // SAFETY: `base` holds `capacity >= size` initialised bytes, and the
        // guest that wrote them is gone with its store.
        let bytes = unsafe { std::slice::from_raw_parts(self.base.as_ptr(), self.size) };
        self.probe.search(bytes);
        // SAFETY: allocated above with this layout.
        unsafe { std::alloc::dealloc(self.base.as_ptr(), Layout::from_size_align_unchecked(self.capacity, ALIGN)) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_memory_is_searched_whole_when_freed_and_keeps_its_bytes_when_it_grows() {
        let probe = GuestMemoryProbe::watching(["marker", "absent"]);
        let creator = ProbedMemories(probe.clone());
        let mut memory = creator.new_memory(MemoryType::new(1, Some(4)), 65_536, Some(4 * 65_536), Some(0), 0).unwrap();
        // SAFETY: the memory holds 65,536 bytes.
        unsafe { std::ptr::copy_nonoverlapping(b"marker".as_ptr(), memory.as_ptr().add(65_530), 6) };
        memory.grow_to(3 * 65_536).unwrap();
        assert!(memory.grow_to(5 * 65_536).is_err(), "past the maximum");
        assert_eq!(memory.byte_size(), 3 * 65_536);
        // SAFETY: as above, after growing: fresh bytes are zero.
        unsafe { std::ptr::copy_nonoverlapping(b"marker".as_ptr(), memory.as_ptr().add(3 * 65_536 - 6), 6) };
        drop(memory);
        assert_eq!(probe.findings(), Findings { memories: 1, bytes: 3 * 65_536, hits: vec![2, 0] });
        assert!(!format!("{probe:?}").contains("marker"));
        assert!(creator.new_memory(MemoryType::new(1, None), 65_536, None, Some(1 << 32), 0).is_err());
    }
}
