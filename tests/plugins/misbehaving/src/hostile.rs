//! The behaviours that attack the sandbox's resource limits.
//!
//! Each is written so the optimiser cannot remove or shorten the work:
//! `black_box` hides values from it, so the loop really spins, the memory is
//! really written, and the recursion really nests.

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::bindings::service::connector1_0_0::log::{Level, log};

/// Burns CPU forever without calling the host: only fuel or epoch
/// interruption (or the wall-clock limit) stops it.
pub fn spin() -> ! {
    let mut counter: u64 = 0;
    loop {
        counter = black_box(counter.wrapping_add(1));
    }
}

/// Allocates 1 MiB chunks and fills every byte, forever. Ends when the host
/// refuses to grow the memory: the allocator's failure aborts (a trap).
pub fn hoard_memory() -> ! {
    const CHUNK: usize = 1024 * 1024;
    let mut hoard: Vec<Vec<u8>> = Vec::new();
    loop {
        // A non-zero fill is a real `memset`, so every page is touched.
        hoard.push(vec![0xA5; CHUNK]);
        black_box(&mut hoard);
    }
}

/// How deep the recursion got. Written on every call: a store the optimiser
/// must keep, which also gives the recursion an exit it cannot rule out.
static DEPTH: AtomicU64 = AtomicU64::new(0);

/// Recurses without bound using only engine stack (no linear memory): ends
/// with the engine's stack-overflow trap (the host's `max_wasm_stack`).
///
/// The result of the inner call is used after it returns, so the call is not
/// in tail position and cannot become a loop.
#[inline(never)]
pub fn recurse_on_engine_stack(depth: u64) -> u64 {
    if DEPTH.swap(depth, Ordering::Relaxed) == u64::MAX {
        return depth;
    }
    let below = recurse_on_engine_stack(depth.wrapping_add(1));
    below.rotate_left(1) ^ depth
}

/// Recurses without bound with a 4 KiB array in every frame. The array's
/// address escapes, so it lives on the shadow stack in linear memory (1 MiB,
/// placed at the bottom of memory): about 250 calls deep the stack pointer
/// runs below address 0 and the next store traps as out of bounds.
#[inline(never)]
pub fn recurse_on_memory_stack(depth: u64) -> u64 {
    let mut frame = [0u8; 4096];
    frame[(depth % 4096) as usize] = depth.to_le_bytes()[0];
    black_box(&mut frame);
    if DEPTH.swap(depth, Ordering::Relaxed) == u64::MAX {
        return depth;
    }
    let below = recurse_on_memory_stack(depth.wrapping_add(1));
    below.wrapping_add(u64::from(frame[(below % 4096) as usize]))
}

/// Traps: a panic aborts, which is a wasm `unreachable`.
pub fn trap() -> ! {
    panic!("test_misbehaving: trap requested by the config");
}

/// A JSON object of exactly `size` bytes (`{"x":"xxx…"}`), so only a size
/// limit can object to it. Built in one allocation of `size` bytes.
/// (Below 8 bytes no such object exists: `{}` padded with spaces when it
/// fits, else plain `x`s.)
pub fn oversized_output(size: usize) -> String {
    const HEAD: &[u8] = br#"{"x":""#;
    const TAIL: &[u8] = br#""}"#;
    let mut text = Vec::with_capacity(size);
    if size >= HEAD.len() + TAIL.len() {
        text.extend_from_slice(HEAD);
        text.resize(size - TAIL.len(), b'x');
        text.extend_from_slice(TAIL);
    } else if size >= 2 {
        text.push(b'{');
        text.resize(size - 1, b' ');
        text.push(b'}');
    } else {
        text.resize(size, b'x');
    }
    String::from_utf8(text).expect("the text is ASCII")
}

/// Logs `count` info messages of 200 bytes each; returns how many calls it
/// made (all of them: `log` cannot fail, the host drops what it will).
pub fn log_flood(count: u64) -> u64 {
    const LENGTH: usize = 200;
    let mut message = String::with_capacity(LENGTH);
    for n in 0..count {
        message.clear();
        message.push_str("test_misbehaving log flood, message ");
        message.push_str(&n.to_string());
        message.push(' ');
        while message.len() < LENGTH {
            message.push('.');
        }
        log(Level::Info, &message);
    }
    count
}
