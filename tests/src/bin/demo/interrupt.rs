//! Ctrl-C (SIGINT) and SIGTERM during the demo: noted by the handler, acted on between steps by
//! unwinding, so that every namespace, process and pin is removed by its owner's drop.

use std::panic;
use std::sync::atomic::{AtomicBool, Ordering};

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

/// The payload of the unwinding that an interruption starts.
struct Interrupted;

extern "C" fn note(_signal: libc::c_int) {
    // An atomic store is async-signal-safe.
    INTERRUPTED.store(true, Ordering::SeqCst);
}

/// Installs the handlers, and a panic hook that stays quiet once interrupted: the children got
/// the same Ctrl-C, so whatever fails next is a consequence, not news.
pub fn install() {
    for signal in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: `note` only stores to an atomic.
        unsafe { libc::signal(signal, note as *const () as libc::sighandler_t) };
    }
    let default = panic::take_hook();
    panic::set_hook(Box::new(move |info| {
        if !interrupted() {
            default(info);
        }
    }));
}

/// Whether an interruption was asked for.
pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::SeqCst)
}

/// Unwinds if an interruption was asked for.
pub fn check() {
    if interrupted() {
        panic::resume_unwind(Box::new(Interrupted));
    }
}
