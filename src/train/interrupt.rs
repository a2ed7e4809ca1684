//! Ctrl-C (SIGINT) during training: the first one asks the loop to stop after the step it is in,
//! write a checkpoint there and say how to go on (`--resume`); a second one ends the process at
//! once, as Ctrl-C always does.
//!
//! Only the training loop listens, and only while it runs ([`Listener`]): before it (reading the
//! tables, building the model) and after it (the final evaluation and model) Ctrl-C stops the
//! process as usual, losing nothing a checkpoint holds.

use std::sync::atomic::{AtomicBool, Ordering};

/// Set by the handler; read and cleared by the one [`Listener`].
static REQUESTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_sigint(_: libc::c_int) {
    // Async-signal-safe: one atomic store. `SA_RESETHAND` has already put the default action
    // back, so the next Ctrl-C ends the process.
    REQUESTED.store(true, Ordering::SeqCst);
}

/// While alive, the first SIGINT is a request to stop ([`Listener::requested`]) instead of the
/// end of the process. Dropping it puts back what was there before.
pub struct Listener {
    previous: Option<libc::sigaction>,
    /// Test hook: `CURATE_SIGINT_AT_STEP=N` sends this process a SIGINT as step N ends, as a
    /// Ctrl-C there would (the integration tests of the stop and `--resume`).
    sigint_at: Option<u64>,
}

impl Listener {
    /// Listens for Ctrl-C when `on`; otherwise a listener that never hears one (library callers
    /// keep their own SIGINT handling).
    pub fn new(on: bool) -> Listener {
        REQUESTED.store(false, Ordering::SeqCst);
        let sigint_at = std::env::var("CURATE_SIGINT_AT_STEP").ok().and_then(|s| s.parse::<u64>().ok());
        if !on {
            return Listener { previous: None, sigint_at: None };
        }
        // SAFETY: plain sigaction calls on zeroed structs; the handler only stores an atomic.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_sigint as extern "C" fn(libc::c_int) as libc::sighandler_t;
            // One-shot (the second Ctrl-C is the default action), and interrupted system calls
            // (a data worker's read) restart instead of failing.
            action.sa_flags = libc::SA_RESETHAND | libc::SA_RESTART;
            libc::sigemptyset(&mut action.sa_mask);
            let mut previous: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(libc::SIGINT, &action, &mut previous) != 0 {
                return Listener { previous: None, sigint_at: None };
            }
            Listener { previous: Some(previous), sigint_at }
        }
    }

    /// Step `step` is done (the test hook's moment).
    pub fn step_ended(&self, step: u64) {
        if self.sigint_at == Some(step) {
            // SAFETY: signals this process; the handler installed in `new` runs.
            unsafe { libc::raise(libc::SIGINT) };
        }
    }

    /// Whether Ctrl-C was pressed since the listener started.
    pub fn requested(&self) -> bool {
        self.previous.is_some() && REQUESTED.load(Ordering::SeqCst)
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        if let Some(previous) = self.previous.take() {
            // SAFETY: restores the action saved in `new`.
            unsafe { libc::sigaction(libc::SIGINT, &previous, std::ptr::null_mut()) };
        }
        REQUESTED.store(false, Ordering::SeqCst);
    }
}
