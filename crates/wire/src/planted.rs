//! The switch for deliberate protocol bugs that prove the simulator's checkers can fail.
//! Each crate with such bugs names them in its own `Bug` enum and expands `planted_bugs!`.

/// Defines `plant(Option<Bug>)`, which plants a bug (or none) in this thread, with the
/// calling crate's `planted-bugs` feature, and `planted(Bug) -> bool`, always false without
/// that feature, so that release builds carry no bug.
#[macro_export]
macro_rules! planted_bugs {
    ($bug:ty) => {
        #[cfg(feature = "planted-bugs")]
        thread_local! {
            static PLANTED: std::cell::Cell<Option<$bug>> = const { std::cell::Cell::new(None) };
        }

        /// Plants `bug` (or none) in every state machine of this crate on this thread.
        #[cfg(feature = "planted-bugs")]
        pub fn plant(bug: Option<$bug>) {
            PLANTED.with(|p| p.set(bug));
        }

        #[cfg(feature = "planted-bugs")]
        pub(crate) fn planted(bug: $bug) -> bool {
            PLANTED.with(|p| p.get() == Some(bug))
        }

        #[cfg(not(feature = "planted-bugs"))]
        pub(crate) fn planted(_: $bug) -> bool {
            false
        }
    };
}
